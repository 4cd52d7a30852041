//! CUDA graphs with memory and kernel nodes: graphs and their nodes (empty, kernel, memory alloc, memory
//! free), executable graphs instantiated from them, and the graph memory those executable graphs hold.
//!
//! The model: adding an alloc node only takes address space (a fresh address, never reused) and charges
//! nothing. An executable graph snapshots its graph's alloc nodes and the sum of its kernel nodes'
//! durations when instantiated, so it outlives the graph. Its first launch charges every alloc node's
//! size to the node's device, all or nothing; it then owns that memory, whatever its free nodes say,
//! until `cuGraphExecDestroy` credits it. Every launch runs its kernel nodes one after another
//! (`timeline`).

use std::collections::BTreeMap;

use crate::config::MAX_DEVICES;
use crate::handles::{self, Keys, Kind};
use crate::memory::ALIGN;
use crate::state::{Fake, Refusal};

/// Bytes of a `CUmemPoolProps`, which an alloc node keeps as given.
pub const POOL_PROPS_BYTES: usize = 88;

/// What `cuGraphAddMemAllocNode` asks for. The pool properties and access descriptors are not read
/// beyond the device; they are kept for `cuGraphMemAllocNodeGetParams`.
pub struct AllocRequest {
    /// Physical device.
    pub device: usize,
    pub size: u64,
    pub pool_props: [u8; POOL_PROPS_BYTES],
    /// Each `CUmemAccessDesc` as its three `int`s: location type, location id, flags.
    pub access: Vec<[i32; 3]>,
}

/// A node to add to a graph.
pub enum NewNode {
    Empty,
    /// A kernel (from `fakegpu_kernel`) that takes `duration` ns.
    Kernel {
        duration: u64,
    },
    MemAlloc(AllocRequest),
    /// Frees the allocation of an alloc node of the same graph, by its address.
    MemFree(u64),
}

/// What a node is, as `cuGraphNodeGetType` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeType {
    Kernel,
    Empty,
    MemAlloc,
    MemFree,
}

enum NodeKind {
    Empty,
    Kernel { duration: u64 },
    MemAlloc { request: AllocRequest, address: u64 },
    MemFree(u64),
}

struct Node {
    graph: u64,
    kind: NodeKind,
}

/// An alloc node as `cuGraphMemAllocNodeGetParams` returns it. `access` points into the node, which
/// owns the descriptors until its graph is destroyed (like the driver's node-owned copy).
pub struct AllocView {
    pub size: u64,
    pub address: u64,
    pub pool_props: [u8; POOL_PROPS_BYTES],
    pub access: *const [i32; 3],
    pub access_count: usize,
}

struct Exec {
    /// (physical device, bytes) of its alloc nodes, summed per device.
    memory: Vec<(usize, u64)>,
    /// Launched at least once: its memory is charged.
    launched: bool,
    /// Nanoseconds its kernel nodes take, run one after another.
    kernel_ns: u64,
}

/// Graph memory that this process's executable graphs hold on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphMemory {
    pub current: u64,
    pub high: u64,
}

pub struct Graphs {
    /// Graph key → its nodes' keys, in creation order.
    graphs: BTreeMap<u64, Vec<u64>>,
    nodes: BTreeMap<u64, Node>,
    execs: BTreeMap<u64, Exec>,
    memory: [GraphMemory; MAX_DEVICES],
    graph_keys: Keys,
    node_keys: Keys,
    exec_keys: Keys,
}

impl Graphs {
    pub fn new() -> Graphs {
        Graphs {
            graphs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            execs: BTreeMap::new(),
            memory: [GraphMemory::default(); MAX_DEVICES],
            graph_keys: Keys::starting_at(1),
            node_keys: Keys::starting_at(1),
            exec_keys: Keys::starting_at(1),
        }
    }

    fn graph_key(&self, handle: u64) -> Result<u64, Refusal> {
        handles::decode(Kind::Graph, handle)
            .filter(|key| self.graphs.contains_key(key))
            .ok_or(Refusal::Unknown)
    }

    fn node(&self, handle: u64) -> Result<&Node, Refusal> {
        handles::decode(Kind::GraphNode, handle).and_then(|key| self.nodes.get(&key)).ok_or(Refusal::Unknown)
    }

    /// The alloc node of graph `graph` at `address`, and whether a free node of that graph frees it.
    fn allocation_at(&self, graph: u64, address: u64) -> Option<bool> {
        let in_graph = self.graphs.get(&graph)?.iter().filter_map(|key| self.nodes.get(key));
        let mut allocated = false;
        let mut freed = false;
        for node in in_graph {
            match node.kind {
                NodeKind::MemAlloc { address: a, .. } if a == address => allocated = true,
                NodeKind::MemFree(a) if a == address => freed = true,
                _ => {}
            }
        }
        allocated.then_some(freed)
    }

    /// Per-device sums of graph `graph`'s alloc nodes.
    fn memory_of(&self, graph: u64) -> Vec<(usize, u64)> {
        let mut sums: BTreeMap<usize, u64> = BTreeMap::new();
        let in_graph = self.graphs.get(&graph).into_iter().flatten().filter_map(|key| self.nodes.get(key));
        for node in in_graph {
            if let NodeKind::MemAlloc { request, .. } = &node.kind {
                let sum = sums.entry(request.device).or_insert(0);
                *sum = sum.saturating_add(request.size);
            }
        }
        sums.into_iter().collect()
    }

    /// Nanoseconds graph `graph`'s kernel nodes take, one after another.
    fn kernel_ns_of(&self, graph: u64) -> u64 {
        let in_graph = self.graphs.get(&graph).into_iter().flatten().filter_map(|key| self.nodes.get(key));
        in_graph.fold(0, |sum: u64, node| match node.kind {
            NodeKind::Kernel { duration } => sum.saturating_add(duration),
            _ => sum,
        })
    }
}

impl Fake {
    /// `cuGraphCreate`: an empty graph.
    pub fn create_graph(&self) -> u64 {
        let mut registry = self.lock();
        let key = registry.graphs.graph_keys.next();
        registry.graphs.graphs.insert(key, Vec::new());
        handles::encode(Kind::Graph, key)
    }

    /// `cuGraphDestroy`: the graph and its nodes; executable graphs made from it stay.
    pub fn destroy_graph(&self, handle: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let graphs = &mut registry.graphs;
        let key = graphs.graph_key(handle)?;
        for node in graphs.graphs.remove(&key).unwrap_or_default() {
            graphs.nodes.remove(&node);
        }
        Ok(())
    }

    /// Adds a node after `dependencies` (nodes of the same graph); returns its handle and, for an alloc
    /// node, the fresh address it hands out. Nothing is charged.
    pub fn add_graph_node(
        &self,
        graph: u64,
        dependencies: &[u64],
        new: NewNode,
    ) -> Result<(u64, u64), Refusal> {
        let mut registry = self.lock();
        let registry = &mut *registry;
        let graphs = &mut registry.graphs;
        let graph = graphs.graph_key(graph)?;
        for &dependency in dependencies {
            if graphs.node(dependency)?.graph != graph {
                return Err(Refusal::Unknown);
            }
        }
        let (kind, address) = match new {
            NewNode::Empty => (NodeKind::Empty, 0),
            NewNode::Kernel { duration } => (NodeKind::Kernel { duration }, 0),
            NewNode::MemAlloc(request) => {
                if request.size == 0 {
                    return Err(Refusal::BadArgument);
                }
                let address = registry.space.take_wide(request.size, ALIGN, 0).ok_or(Refusal::OutOfMemory)?;
                (NodeKind::MemAlloc { request, address }, address)
            }
            // Like the driver: only an address an alloc node returned, and only one free of it per graph.
            NewNode::MemFree(address) => match graphs.allocation_at(graph, address) {
                Some(false) => (NodeKind::MemFree(address), 0),
                _ => return Err(Refusal::BadArgument),
            },
        };
        let key = graphs.node_keys.next();
        graphs.nodes.insert(key, Node { graph, kind });
        graphs.graphs.entry(graph).or_default().push(key);
        Ok((handles::encode(Kind::GraphNode, key), address))
    }

    /// `cuGraphGetNodes`: the graph's node handles, in creation order.
    pub fn graph_nodes(&self, graph: u64) -> Result<Vec<u64>, Refusal> {
        let registry = self.lock();
        let key = registry.graphs.graph_key(graph)?;
        let nodes = registry.graphs.graphs.get(&key).map(Vec::as_slice).unwrap_or_default();
        Ok(nodes.iter().map(|&node| handles::encode(Kind::GraphNode, node)).collect())
    }

    pub fn node_type(&self, node: u64) -> Result<NodeType, Refusal> {
        Ok(match self.lock().graphs.node(node)?.kind {
            NodeKind::Empty => NodeType::Empty,
            NodeKind::Kernel { .. } => NodeType::Kernel,
            NodeKind::MemAlloc { .. } => NodeType::MemAlloc,
            NodeKind::MemFree(_) => NodeType::MemFree,
        })
    }

    /// `cuGraphMemAllocNodeGetParams`: an alloc node's parameters; another node type → BadArgument.
    pub fn alloc_node(&self, node: u64) -> Result<AllocView, Refusal> {
        let registry = self.lock();
        let NodeKind::MemAlloc { request, address } = &registry.graphs.node(node)?.kind else {
            return Err(Refusal::BadArgument);
        };
        let access = if request.access.is_empty() { std::ptr::null() } else { request.access.as_ptr() };
        Ok(AllocView {
            size: request.size,
            address: *address,
            pool_props: request.pool_props,
            access,
            access_count: request.access.len(),
        })
    }

    /// Instantiates a graph: an executable graph that remembers its alloc nodes and how long its kernel
    /// nodes take. Charges nothing.
    pub fn instantiate_graph(&self, graph: u64) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        let graphs = &mut registry.graphs;
        let graph = graphs.graph_key(graph)?;
        let (memory, kernel_ns) = (graphs.memory_of(graph), graphs.kernel_ns_of(graph));
        let key = graphs.exec_keys.next();
        graphs.execs.insert(key, Exec { memory, launched: false, kernel_ns });
        Ok(handles::encode(Kind::GraphExec, key))
    }

    /// `cuGraphLaunch`: the first launch charges the executable graph's memory, all or nothing; later
    /// launches charge nothing more. Returns how long its kernel nodes take, for the caller to queue.
    pub fn launch_graph(&self, exec: u64) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        let graphs = &mut registry.graphs;
        let key = handles::decode(Kind::GraphExec, exec).ok_or(Refusal::Unknown)?;
        let exec = graphs.execs.get_mut(&key).ok_or(Refusal::Unknown)?;
        if exec.launched {
            return Ok(exec.kernel_ns);
        }
        // Refuse up front what cannot fit now, so that a refused launch does not even raise a peak; the
        // rollback below only covers other processes racing for a shared card.
        if exec
            .memory
            .iter()
            .any(|&(device, bytes)| self.ledger.used(device).saturating_add(bytes) > self.memory)
        {
            return Err(Refusal::OutOfMemory);
        }
        for (charged, &(device, bytes)) in exec.memory.iter().enumerate() {
            if let Err(refusal) = self.charge(device, bytes) {
                for &(device, bytes) in &exec.memory[..charged] {
                    self.credit(device, bytes);
                }
                return Err(refusal);
            }
        }
        exec.launched = true;
        for &(device, bytes) in &exec.memory {
            let held = &mut graphs.memory[device];
            held.current += bytes;
            held.high = held.high.max(held.current);
        }
        Ok(exec.kernel_ns)
    }

    /// `cuGraphExecDestroy`: credits the memory a launch charged.
    pub fn destroy_exec(&self, exec: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let graphs = &mut registry.graphs;
        let key = handles::decode(Kind::GraphExec, exec).ok_or(Refusal::Unknown)?;
        let exec = graphs.execs.remove(&key).ok_or(Refusal::Unknown)?;
        if exec.launched {
            for (device, bytes) in exec.memory {
                self.credit(device, bytes);
                graphs.memory[device].current = graphs.memory[device].current.saturating_sub(bytes);
            }
        }
        Ok(())
    }

    /// Graph memory that this process's executable graphs hold on physical `device`, and its peak.
    pub fn graph_memory(&self, device: usize) -> GraphMemory {
        self.lock().graphs.memory[device]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(device: usize, size: u64) -> AllocRequest {
        AllocRequest { device, size, pool_props: [0; POOL_PROPS_BYTES], access: Vec::new() }
    }

    #[test]
    fn memory_is_summed_per_device_and_free_nodes_pair_with_alloc_nodes() {
        let mut graphs = Graphs::new();
        graphs.graphs.insert(1, vec![1, 2, 3, 4]);
        let alloc = |request, address| Node { graph: 1, kind: NodeKind::MemAlloc { request, address } };
        graphs.nodes.insert(1, alloc(request(0, 100), 1000));
        graphs.nodes.insert(2, alloc(request(1, 7), 2000));
        graphs.nodes.insert(3, alloc(request(0, 50), 3000));
        graphs.nodes.insert(4, Node { graph: 1, kind: NodeKind::MemFree(2000) });
        assert_eq!(graphs.memory_of(1), [(0, 150), (1, 7)]);
        assert_eq!(graphs.kernel_ns_of(1), 0);
        assert_eq!(graphs.allocation_at(1, 1000), Some(false));
        assert_eq!(graphs.allocation_at(1, 2000), Some(true), "already freed in this graph");
        assert_eq!(graphs.allocation_at(1, 1001), None, "not an alloc node's address");
        assert_eq!(graphs.allocation_at(2, 1000), None, "another graph");
        assert!(graphs.memory_of(2).is_empty());
    }

    #[test]
    fn kernel_nodes_run_one_after_another() {
        let mut graphs = Graphs::new();
        graphs.graphs.insert(1, vec![1, 2, 3]);
        let kernel = |duration| Node { graph: 1, kind: NodeKind::Kernel { duration } };
        graphs.nodes.insert(1, kernel(10));
        graphs.nodes.insert(2, Node { graph: 1, kind: NodeKind::Empty });
        graphs.nodes.insert(3, kernel(32));
        assert_eq!(graphs.kernel_ns_of(1), 42);
        assert_eq!(graphs.kernel_ns_of(2), 0);
    }
}
