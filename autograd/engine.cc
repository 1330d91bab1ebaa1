// The backward engine. Single-threaded: count dependencies over the reachable graph, then run
// nodes whose gradients are complete, latest-created first, summing gradients that meet at
// a node input. Each node's saved tensors are dropped the moment it has run.
//
// The tape's whole policy (docs/autograd.md says it at length):
//  1. An op records a node only when grad mode is on and an input requires grad.
//  2. A node saves only what its backward needs (SavedTensor, detached: no reference cycles).
//  3. Backward frees each node's saved tensors as soon as it has run, unless retain_graph.
//  4. An in-place write bumps the storage's version; unpacking a changed saved tensor raises an
//     error naming the op that saved it.
//  5. Backward runs under no_grad; each gradient is summed to its input's shape and cast to its
//     dtype and device here (conform), once for every op.
//  6. Saved tensors may instead be rebuilt from a checkpoint region or brought back from host
//     memory (autograd/recompute.h, autograd/offload.h); the node does not know which.
#include "autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "core/profiler.h"
#include "kernels/ops.h"

namespace mg::autograd {

namespace {

struct ByPriority {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr < b->sequence_nr;  // max-heap on sequence_nr: later ops first
  }
};

// Adds `g` into a gradient slot, out of place: the same gradient tensor may flow down
// several edges (add's backward hands `g` to both inputs), so it is never written to.
// Gradients of two dtypes meet at a node that takes a wider one (Node::accepts_grad_dtype):
// the sum is made in the wider.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = g;
  } else if (slot.dtype() != g.dtype()) {
    const DType wide = promote_types(slot.dtype(), g.dtype());
    slot = kernels::add(kernels::cast(slot, wide), kernels::cast(g, wide));
  } else {
    slot = kernels::add(slot, g);
  }
}

// A gradient produced for input `edge` must match what that node produced in forward.
Tensor conform(const Tensor& g, const Edge& edge, const Node& from, size_t index) {
  const Node& to = *edge.node;
  if (edge.input_nr >= to.output_shapes.size()) return g;
  Tensor r = g;
  const Shape& want = to.output_shapes[edge.input_nr];
  if (r.sizes() != want) {
    MG_CHECK(r.numel() >= shape_numel(want), AutogradError, "backward of '", from.name(),
             "' returned an invalid gradient at index ", index, ": got shape ", shape_str(r.sizes()),
             ", expected shape ", shape_str(want));
    r = kernels::sum_to(r, want);
  }
  const bool taken_wider = edge.input_nr == 0 && to.accepts_grad_dtype == r.dtype();
  if (r.dtype() != to.output_dtypes[edge.input_nr] && !taken_wider)
    r = kernels::cast(r, to.output_dtypes[edge.input_nr]);
  if (r.device() != to.output_devices[edge.input_nr]) r = raw::to_device(r, to.output_devices[edge.input_nr]);
  return r;
}

// Stores a retained gradient on a non-leaf output (retain_grad()); accumulates like a leaf's.
void retain(Node& node, const std::vector<Tensor>& buf) {
  for (size_t i = 0; i < node.output_tensors.size() && i < buf.size(); ++i) {
    if (!buf[i].defined()) continue;
    auto impl = node.output_tensors[i].lock();
    const AutogradMeta* m = impl ? meta(*impl) : nullptr;
    if (!m || !m->retains_grad_) continue;
    if (m->grad_fn_.get() != &node || m->output_nr_ != i) continue;  // history was rebased
    Tensor t(impl);
    Tensor g = buf[i].dtype() == t.dtype() ? buf[i] : kernels::cast(buf[i], t.dtype());
    Tensor old = t.grad();
    t.set_grad(old.defined() ? kernels::add(old, g) : raw::clone(g));
  }
}

struct GraphTask {
  bool accumulate_into_leaves = true;  // false for autograd::grad()
  bool retain_graph = false;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  // grad(): which node inputs are captured into which result slot, and which nodes must run.
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  std::unordered_set<Node*> must_run;
  std::vector<Tensor> captured;
};

// Dependency counts over everything reachable from the roots; returns nodes in discovery order.
std::vector<Node*> count_dependencies(GraphTask& task, const std::vector<std::shared_ptr<Node>>& roots) {
  std::vector<Node*> order, stack;
  std::unordered_set<Node*> seen;
  for (const auto& r : roots)
    if (seen.insert(r.get()).second) stack.push_back(r.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      task.deps[e.node.get()]++;
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return order;
}

// For grad(): a node must run when some node below it has a captured input.
void compute_must_run(GraphTask& task, const std::vector<Node*>& nodes) {
  // Topological order (Kahn) over the reachable graph, then a reverse sweep.
  std::unordered_map<Node*, int> indeg = task.deps;
  std::vector<Node*> topo;
  for (Node* n : nodes)
    if (indeg[n] == 0) topo.push_back(n);
  for (size_t i = 0; i < topo.size(); ++i)
    for (const Edge& e : topo[i]->next_edges)
      if (e.valid() && --indeg[e.node.get()] == 0) topo.push_back(e.node.get());
  std::unordered_set<Node*> needed;
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    Node* n = *it;
    bool child_needed = false;
    for (const Edge& e : n->next_edges)
      if (e.valid() && needed.count(e.node.get())) child_needed = true;
    if (child_needed) task.must_run.insert(n);
    if (child_needed || task.captures.count(n)) needed.insert(n);
  }
}

void execute(GraphTask& task, const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  MG_CHECK(grads.empty() || grads.size() == roots.size(), ValueError, "backward: got ", grads.size(), " gradients for ",
           roots.size(), " tensors");
  std::vector<std::shared_ptr<Node>> root_nodes;
  std::vector<std::pair<Edge, Tensor>> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    MG_CHECK(r.defined(), ValueError, "backward: tensor ", i, " is undefined");
    MG_CHECK(r.requires_grad(), AutogradError, "backward: element ", i,
             " of tensors does not require grad and does not have a grad_fn (was it computed under no_grad, "
             "or from tensors that do not require grad?)");
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      MG_CHECK(r.numel() == 1, AutogradError,
               "backward: grad can be implicitly created only for scalar outputs, got shape ", shape_str(r.sizes()),
               " (pass a gradient of that shape, or reduce the output first, e.g. sum() or mean())");
      g = ones_like(r);
    } else {
      MG_CHECK(g.sizes() == r.sizes(), ShapeError, "backward: gradient of shape ", shape_str(g.sizes()),
               " for an output of shape ", shape_str(r.sizes()));
      if (g.dtype() != r.dtype()) g = kernels::cast(g, r.dtype());
      if (g.device() != r.device()) g = raw::to_device(g, r.device());
      g = g.detach();
    }
    Edge e = gradient_edge(r);
    root_nodes.push_back(e.node);
    seeds.emplace_back(e, g);
  }
  std::vector<Node*> nodes = count_dependencies(task, root_nodes);
  if (!task.accumulate_into_leaves) compute_must_run(task, nodes);

  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ByPriority> ready;
  std::unordered_set<Node*> queued;
  for (auto& [e, g] : seeds) {
    auto& buf = task.buffers[e.node.get()];
    if (buf.size() < e.node->num_outputs) buf.resize(e.node->num_outputs);
    accumulate(buf[e.input_nr], g);
  }
  for (const auto& n : root_nodes)
    if (task.deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push(n);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> buf = std::move(task.buffers[node.get()]);
    task.buffers.erase(node.get());
    buf.resize(node->num_outputs);

    if (auto it = task.captures.find(node.get()); it != task.captures.end())
      for (auto [input_nr, slot] : it->second)  // grad() returns the input's own dtype
        accumulate(task.captured[slot], buf[input_nr].defined() && input_nr < node->output_dtypes.size()
                                            ? kernels::cast(buf[input_nr], node->output_dtypes[input_nr])
                                            : buf[input_nr]);

    const bool is_sink = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
    bool run = task.accumulate_into_leaves ? true : task.must_run.count(node.get()) > 0;
    if (!run) continue;  // grad(): nothing below this node was asked for
    if (task.accumulate_into_leaves) retain(*node, buf);

    bool any_defined = false;
    for (const Tensor& g : buf) any_defined |= g.defined();
    std::vector<Tensor> outs;
    if (any_defined) {
      if (!is_sink && node->materialize_grads)
        for (size_t i = 0; i < buf.size(); ++i)
          if (!buf[i].defined())
            buf[i] = zeros(node->output_shapes[i], {node->output_dtypes[i], node->output_devices[i]});
      {
        profiler::Range r(profiler::enabled() ? profiler::intern(node->name()) : nullptr, "backward");
        outs = node->apply(std::move(buf));
      }
      MG_CHECK(is_sink || outs.size() == node->next_edges.size(), AutogradError, "backward of '", node->name(),
               "' returned ", outs.size(), " gradients, expected ", node->next_edges.size());
    }
    buf.clear();
    if (!task.retain_graph && !is_sink) {
      node->release_saved();
      node->released = true;
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      if (i < outs.size() && outs[i].defined()) {
        auto& slot_buf = task.buffers[e.node.get()];
        if (slot_buf.size() < e.node->num_outputs) slot_buf.resize(e.node->num_outputs);
        accumulate(slot_buf[e.input_nr], conform(outs[i], e, *node, i));
      }
      if (--task.deps[e.node.get()] == 0 && queued.insert(e.node.get()).second) ready.push(e.node);
    }
  }
}

// The callbacks queued during this thread's outermost backward, and how deep the backwards nest.
thread_local std::vector<std::function<void()>> queued_callbacks;
thread_local int backward_depth = 0;

// Marks one backward on this thread; the outermost runs the queued callbacks when it ends well
// and drops them when it ends with an error.
struct BackwardFrame {
  BackwardFrame() { ++backward_depth; }
  ~BackwardFrame() {
    if (--backward_depth == 0) queued_callbacks.clear();
  }
  void finish() {
    if (backward_depth != 1) return;
    // A callback may queue another (it runs too, after the ones before it).
    for (size_t i = 0; i < queued_callbacks.size(); ++i) {
      std::function<void()> fn = std::move(queued_callbacks[i]);
      fn();
    }
    queued_callbacks.clear();
  }
};

}  // namespace

void queue_callback(std::function<void()> fn) {
  MG_CHECK(backward_depth > 0, AutogradError, "queue_callback: called outside a backward");
  queued_callbacks.push_back(std::move(fn));
}

bool in_backward() { return backward_depth > 0; }

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  // Backward never records (no create_graph), and what it allocates is gradient memory.
  NoGradGuard no_grad;
  MemoryCategoryGuard category(MemoryCategory::Gradients);
  BackwardFrame frame;
  GraphTask task;
  task.retain_graph = retain_graph;
  execute(task, roots, grads);
  frame.finish();
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  NoGradGuard no_grad;
  MemoryCategoryGuard category(MemoryCategory::Gradients);
  BackwardFrame frame;
  GraphTask task;
  task.accumulate_into_leaves = false;
  task.retain_graph = retain_graph;
  task.captured.resize(inputs.size());
  std::vector<std::shared_ptr<Node>> keep;  // accumulators created here must outlive the run
  for (size_t i = 0; i < inputs.size(); ++i) {
    MG_CHECK(needs_grad(inputs[i]), AutogradError, "grad: input ", i,
             " does not require grad (differentiated tensors must require grad)");
    Edge e = gradient_edge(inputs[i]);
    keep.push_back(e.node);
    task.captures[e.node.get()].emplace_back(e.input_nr, i);
  }
  execute(task, outputs, grad_outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    MG_CHECK(allow_unused || task.captured[i].defined(), AutogradError, "grad: input ", i, " (shape ",
             shape_str(inputs[i].sizes()),
             ") appears to not have been used in the graph; set allow_unused=true if this is expected");
    if (task.captured[i].defined()) {
      Tensor c = task.captured[i];
      if (c.dtype() != inputs[i].dtype()) c = kernels::cast(c, inputs[i].dtype());
      task.captured[i] = c.detach();
    }
  }
  frame.finish();
  return task.captured;
}

}  // namespace mg::autograd
