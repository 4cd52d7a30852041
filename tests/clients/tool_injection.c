/* A stand-in for an injection tool (Nsight Systems' ELF interposer, as its documentation and
 * binaries describe it): loaded by the driver through CUDA_INJECTION64_PATH, its
 * InitializeInjection rewrites the global offset table of every loaded object, so that the
 * object's calls to dlsym and to a few driver entry points go through the tool's wrappers first.
 * Each wrapper counts the call and hands it to whatever the slot held before: the tool observes
 * the program, and the order becomes program -> tool -> what the program bound to.
 * TOOL_INJECTION_REPORT=1 prints, at exit, the slots rewritten and the calls seen. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_subset.h"

#if defined(__x86_64__)
#define JUMP_SLOT R_X86_64_JUMP_SLOT
#define GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define JUMP_SLOT R_AARCH64_JUMP_SLOT
#define GLOB_DAT R_AARCH64_GLOB_DAT
#endif

static atomic_ulong patched, calls;

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*info_fn)(size_t *, size_t *);
static dlsym_fn next_dlsym;
static alloc_fn next_alloc;
static info_fn next_info;

static void *wrap_dlsym(void *handle, const char *name) {
    atomic_fetch_add(&calls, 1);
    return next_dlsym(handle, name);
}

static CUresult wrap_alloc(CUdeviceptr *dptr, size_t bytes) {
    atomic_fetch_add(&calls, 1);
    return next_alloc(dptr, bytes);
}

static CUresult wrap_info(size_t *free_bytes, size_t *total) {
    atomic_fetch_add(&calls, 1);
    return next_info(free_bytes, total);
}

/* Points `slot` at `wrapper`; the wrapper hands calls to `name` as the process resolves it (a
 * slot of a lazily bound call still holds the linker's stub, not the definition). */
static void rewrite(void **slot, void *wrapper, void **next, const char *name) {
    if (*slot == wrapper) return;
    if (!*next) *next = dlsym(RTLD_DEFAULT, name);
    if (!*next) return;
    long page = sysconf(_SC_PAGESIZE);
    void *start = (void *)((uintptr_t)slot & ~(uintptr_t)(page - 1));
    if (mprotect(start, (size_t)page, PROT_READ | PROT_WRITE) != 0) return;
    *slot = wrapper;
    atomic_fetch_add(&patched, 1);
}

static void rewrite_relocations(ElfW(Addr) base, const ElfW(Rela) * rela, size_t bytes, const ElfW(Sym) * symtab,
                                const char *strtab) {
    for (size_t k = 0; k < bytes / sizeof *rela; k++) {
        unsigned long type = ELF64_R_TYPE(rela[k].r_info);
        if (type != JUMP_SLOT && type != GLOB_DAT) continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rela[k].r_info)].st_name;
        void **slot = (void **)(base + rela[k].r_offset);
        if (strcmp(name, "dlsym") == 0) rewrite(slot, (void *)wrap_dlsym, (void **)&next_dlsym, name);
        else if (strcmp(name, "cuMemAlloc_v2") == 0) rewrite(slot, (void *)wrap_alloc, (void **)&next_alloc, name);
        else if (strcmp(name, "cuMemGetInfo_v2") == 0) rewrite(slot, (void *)wrap_info, (void **)&next_info, name);
    }
}

static int visit(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    Dl_info self;
    if (dladdr((void *)visit, &self) && info->dlpi_name && strcmp(info->dlpi_name, self.dli_fname) == 0) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const ElfW(Dyn) *dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        const ElfW(Rela) *jmprel = NULL, *rela = NULL;
        size_t jmprel_size = 0, rela_size = 0;
        const ElfW(Sym) *symtab = NULL;
        const char *strtab = NULL;
        for (; dyn->d_tag != DT_NULL; dyn++) {
            ElfW(Addr) at = dyn->d_un.d_ptr;
            /* glibc relocates these in place; an object that keeps them relative needs its base. */
            if (at && at < info->dlpi_addr) at += info->dlpi_addr;
            switch (dyn->d_tag) {
            case DT_JMPREL: jmprel = (const ElfW(Rela) *)at; break;
            case DT_PLTRELSZ: jmprel_size = dyn->d_un.d_val; break;
            case DT_RELA: rela = (const ElfW(Rela) *)at; break;
            case DT_RELASZ: rela_size = dyn->d_un.d_val; break;
            case DT_SYMTAB: symtab = (const ElfW(Sym) *)at; break;
            case DT_STRTAB: strtab = (const char *)at; break;
            }
        }
        if (!symtab || !strtab) continue;
        if (jmprel) rewrite_relocations(info->dlpi_addr, jmprel, jmprel_size, symtab, strtab);
        if (rela) rewrite_relocations(info->dlpi_addr, rela, rela_size, symtab, strtab);
    }
    return 0;
}

static void report(void) {
    if (getenv("TOOL_INJECTION_REPORT"))
        printf("injection_patched=%lu\ninjection_calls=%lu\n", atomic_load(&patched), atomic_load(&calls));
}

int InitializeInjection(void) {
    dl_iterate_phdr(visit, NULL);
    atexit(report);
    return 1;
}
