# libvgpu's release archives built from source on Debian 12, and an image holding one
# architecture's files under /usr/local/vgpu (where HAMi mounts its library from):
#
#   docker build -t libvgpu .                                       x86_64 files in /usr/local/vgpu
#   docker build --platform linux/arm64 -t libvgpu:arm64 .          aarch64 files
#   docker build --target archives --output type=local,dest=dist .  the archives into dist/
#
# The build stage runs on x86_64 and cross-builds aarch64 (ci/package does both); its toolchain
# is the image's Rust, not the stable channel rust-toolchain.toml names.
ARG RUST_IMAGE=rust:1.95-bookworm

FROM --platform=linux/amd64 ${RUST_IMAGE} AS build
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        binutils gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_TOOLCHAIN=${RUST_VERSION}
RUN rustup target add aarch64-unknown-linux-gnu
WORKDIR /src
COPY . .
# Archive timestamps: the build's SOURCE_DATE_EPOCH if given, else the time of the build.
ARG SOURCE_DATE_EPOCH
RUN ci/package /out
# Unpack the architecture the image is for: ARCH (x86_64, aarch64), else the target platform's.
ARG TARGETARCH
ARG ARCH
RUN arch=${ARCH:-$(if [ "$TARGETARCH" = arm64 ]; then echo aarch64; else echo x86_64; fi)} \
    && mkdir /vgpu \
    && tar -xzf /out/libvgpu-*-"$arch".tar.gz -C /vgpu --strip-components=1

FROM scratch AS archives
COPY --from=build /out/ /

FROM scratch
COPY --from=build /vgpu/ /usr/local/vgpu/
