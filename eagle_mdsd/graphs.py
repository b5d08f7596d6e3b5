"""CUDA graphs of the decoding cycle's two phases (cycle.py: draft, verify).

A phase reads and writes only device tensors made before its capture (the cycle's state, tree buffers and
caches; cache.py: new entries written at slots given as a tensor, attention over a span with a mask), so
under one key - (phase, cycle, parity, temperature, span bucket) - it has the same shapes every cycle and is
captured once and replayed: one launch instead of the thousands of ops of a cycle issued from Python.  A phase
takes no inputs (a graph's inputs are copied into buffers of its own before each replay) and a graph
writes into the same output tensors every time; the graphs share one memory pool, so a caller uses (or
copies) a graph's outputs before the next replay of any graph.  What a function keeps beyond its call
(caches, state between cycles) it writes into tensors made before its warm-up: the warm-up's allocations
belong to a side stream, the capture's to the pool.  Graphs are captured and replayed with their device
current, which need not be the process's.

Capture happens on a graph's first call and its seconds are counted apart (`seconds`), so that the
decoder can keep them out of the timed region.  If the stock modules refuse capture, the command ends in one
line naming --cuda-graphs off: a failed capture leaves CUDA's generator and the capture stream in capture mode,
so no eager fallback could run on in that process.

Beside the graphs, what a cycle needs of the device to keep it busy: the generator its graphs draw from
(`generator`) and the copy of its small result to the host that lets the host queue work before it waits
(`Transfer`).
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import UsageError, compiler_failure

CHOICES = ("auto", "off", "compile")
# What a replay is labelled in the profiler: hostsync.top_level_ops counts replays, not the ops inside them.
REPLAY = "eagle_mdsd::graph_replay"


def resolve(choice: str, device: torch.device, model=None) -> bool:
    """--cuda-graphs auto|off|compile -> whether to capture: auto and compile mean on CUDA (compile also compiles
    the models' forwards, `compiled`), for a `model` on one device: a capture records the work of one device's
    stream, so a target spread over GPUs (--device auto) runs eagerly."""
    if choice not in CHOICES:
        raise UsageError(f"unknown --cuda-graphs {choice!r}: use one of {', '.join(CHOICES)}")
    spread = model is not None and len({parameter.device for parameter in model.parameters()}) > 1
    return choice in ("auto", "compile") and torch.device(device).type == "cuda" and not spread


def compiled(module):
    """A model's forward compiled by torch.compile (inductor), with dynamic shapes: one compilation serves every
    row count and span, so a phase's graphs of every span bucket replay one compiled code.  Under CUDA graphs its
    kernels are captured like any others; what it buys is fewer, fused kernels a layer (norms, rotary embeddings,
    activations), where a captured step of a small model spends its time (launch gaps between tiny kernels).
    Where inductor cannot compile (no C++ compiler on a CPU, say), the first call says so in one line."""
    import torch._dynamo.config
    import torch._dynamo.exc

    # Compiled code is kept per code object, and every decoder's forwards run the same module's code: past dynamo's
    # limit of 8 compilations of one (a decoder's phases may take them all), later ones would run uncompiled.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    compiled_module = torch.compile(module, dynamic=True)

    def forward(*args, **kwargs):
        try:
            return compiled_module(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            raise UsageError(f"--cuda-graphs compile: torch.compile failed ({compiler_failure(error)}): use "
                             f"--cuda-graphs auto") from error

    return forward


class Graphs:
    """One captured graph per key (the caller's: the cycle's is its phase, cycle, parity, temperature and span)."""

    refusals: tuple = (RuntimeError,)  # what a capture raises when CUDA does not allow what the function does

    def __init__(self, device=None):
        """device: the CUDA device of the functions' tensors (None: the current one), made current while its graphs
        are captured and replayed: a capture records the work of the current device's capturing stream alone, and
        draws from the default generator of the device current as it begins (`generator`)."""
        self.device = None if device is None else torch.device(device)
        self.entries: dict = {}
        self.seconds = 0.0  # spent warming up and capturing
        self.pool = None  # the memory pool this object's graphs share; a new one once they are all forgotten
        self.stream = None  # the side stream their warm-ups and captures run on, made on `device`

    def run(self, key, function, *inputs, generator: torch.Generator | None = None):
        """key: (what, the id of the object whose buffers the function uses, ...), as `forget` reads it.
        generator: the one the function draws from; warm-up and capture leave its state as they found it, so
        the first replay draws what an eager call would."""
        with contextlib.nullcontext() if self.device is None else torch.cuda.device(self.device):
            entry = self.entries.get(key)
            if entry is None:
                entry = self._new(key, function, inputs, generator)
            buffers, graph, outputs = entry
            for buffer, value in zip(buffers, inputs):
                buffer.copy_(value)
            graph.replay()
        return outputs

    def _new(self, key, function, inputs, generator):
        """The entry (input buffers, graph, outputs) of a function warmed up and captured."""
        start = time.perf_counter()
        state = None if generator is None else generator.get_state()
        buffers = self._warm_up(function, inputs)  # an error here is the call's own: it is raised
        try:
            entry = self._capture(function, buffers)
        except self.refusals as error:  # the stock modules did something capture does not allow
            why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            raise UsageError(f"CUDA graph capture failed ({why}): run with --cuda-graphs off (a process whose "
                             f"capture failed cannot go on on CUDA)") from error
        finally:
            self.seconds += time.perf_counter() - start
        _restore(generator, state)
        self.entries[key] = entry
        return entry

    def forget(self, owner: int) -> None:
        """Drop the graphs captured on the buffers of the object of id `owner` (about to be let go): their memory
        goes back to the pool, and a later object given the same id never replays them.  Once none is left the
        pool goes too: CUDA refuses to capture into a pool no graph holds while tensors made in it live on (a
        cache's slots, until the garbage collector frees the cache), so the next capture takes a new one."""
        self.entries = {key: entry for key, entry in self.entries.items() if key[1] != owner}
        if not self.entries:
            self.pool = None

    def _warm_up(self, function, inputs):
        """The graph's input buffers, after two eager calls on the side stream (kernel choice, per-stream
        workspaces).  What they allocate belongs to that stream: a tensor that outlives the call (a cache, state
        between cycles) must be made before, on the stream that uses it."""
        buffers = [value.clone() for value in inputs]
        side = self._side()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                function(*buffers)
        torch.cuda.current_stream().wait_stream(side)
        return buffers

    def _side(self):
        if self.stream is None:
            self.stream = torch.cuda.Stream()  # on the current device, the graphs' (run)
        return self.stream

    def _capture(self, function, buffers):
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        collecting = gc.isenabled()
        gc.disable()  # a collection inside the capture could free another graph, which a capturing stream refuses
        try:
            # cuBLAS keeps a workspace a stream, made at its first GEMM (the warm-up's) outside the graphs' pool, and
            # torch frees them all at times (torch.compile's graphs, a graph destroyed): a captured GEMM would then
            # address freed memory.  Freed now, the capture's GEMMs make their workspace in the pool the graphs hold.
            getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
            # on a stream of the graphs' device: torch's default capture stream is made once, on the device that
            # was current at the process's first capture
            with torch.cuda.graph(graph, pool=self.pool, stream=self._side()):
                outputs = function(*buffers)
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize()
        return buffers, graph, outputs


def _restore(generator, state) -> None:
    """Put a generator back to `state` (taken before a warm-up and capture), where it allows it: one that captured
    graphs hold may refuse, and then only the first replay draws otherwise than an eager call would."""
    if state is None:
        return
    try:
        generator.set_state(state)
    except RuntimeError:
        pass


class Emulated(Graphs):
    """Graphs emulated on any device, for counting what the host issues around them and for checking on a CPU
    what CUDA graphs replay: the warm-up runs the function twice as on CUDA (so a phase that a rerun changes shows
    up here too), 'capture' runs it once more, and every replay runs it again from the graph's own input buffers,
    writing its tensors into the outputs of the capture (as a CUDA graph writes into the same memory).  Captures
    and replays run inside a profiler range named REPLAY."""

    checked = False
    refusals = ()  # an error in an emulated capture is the function's own

    @staticmethod
    def _warm_up(function, inputs):
        """Two eager calls before the capture, as on CUDA: a phase must leave what a rerun leaves."""
        buffers = [value.clone() for value in inputs]
        for _ in range(2):
            function(*buffers)
        return buffers

    def _capture(self, function, buffers):
        tracing = ReplayTrace if self.checked else contextlib.nullcontext
        with torch.profiler.record_function(REPLAY), tracing() as captured:
            outputs = function(*buffers)

        class Graph:
            @staticmethod
            def replay():
                with torch.profiler.record_function(REPLAY), tracing() as replayed:
                    fresh = function(*buffers)
                if captured is not None:
                    captured.check(replayed)
                for old, new in zip(_flat_tensors(outputs), _flat_tensors(fresh)):
                    old.copy_(new)

        return buffers, Graph(), outputs


class Checked(Emulated):
    """Emulated graphs whose every replay is traced op by op and must match its capture (`ReplayTrace`).  A CUDA
    graph replays the capture's kernels on the capture's memory with the capture's scalars, where an eager rerun
    reads whatever the host holds now: a replay that differs (a length baked in as a Python number, a buffer
    swapped for a new tensor) raises ReplayDiverged naming the op, since under CUDA graphs it would compute
    something else than eager code.  So does an index write (index_copy, scatter, x[index] = values) that
    writes two different values to one index, which CUDA resolves in no fixed order, a float sum over indices
    (scatter_add, index_add) that adds two values to one element, which CUDA adds in no fixed order, and an op
    that reads the device from the host (.item(), nonzero, ...), which CUDA refuses to capture.  Not seen on a
    CPU: a 0-dim CPU tensor from outside the phase changed in place (on CUDA its value is fixed at capture).  Some
    2-3x slower than Emulated: for tests."""

    checked = True


class ReplayDiverged(AssertionError):
    """An emulated replay did other work than its capture: under CUDA graphs it would not compute what eager
    code does."""


_TOLIST = torch.Tensor.tolist  # unwrapped: a host value read in a trace is no transfer hostsync.syncs counts
_LIFT = torch.ops.aten.lift_fresh.default


class ReplayTrace(TorchDispatchMode):
    """Each aten op of a block, as a CUDA graph records it: the op, its scalars, and each tensor's memory - named
    by the op of the block that made it, by its value for a tensor of host data, or, for a tensor from outside
    the block (a buffer, a cache, a parameter), by its address, offset, shape and strides."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.made: dict[int, tuple] = {}  # storage address -> how the trace names memory made in the block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = len(self.ops)
        if func in _HOST_READS:
            raise ReplayDiverged(f"{func} reads the device from the host inside a captured phase: CUDA refuses to "
                                 f"capture it")
        if func is _LIFT:  # a tensor of host data (x[i] = 3, say): a graph keeps its value
            made = ("host data", self._described(_TOLIST(args[0]), []))
            self.ops.append((func, made))
            self.made[args[0].untyped_storage().data_ptr()] = made
            return func(*args, **kwargs)
        read: list[int] = []
        self.ops.append((func, self._described(args, read), self._described(kwargs, read) if kwargs else ()))
        out = func(*args, **kwargs)
        if func in _INDEX_WRITES:
            _check_one_writer(func, args, kwargs, out)
        if func in _INDEX_SUMS or _accumulates(func, args, kwargs):
            _check_one_addend(func, args, kwargs, out)
        for position, tensor in enumerate((out,) if isinstance(out, torch.Tensor) else
                                          out if isinstance(out, (tuple, list)) else ()):
            if isinstance(tensor, torch.Tensor):  # new memory, not a view of or a write into an input
                address = tensor.untyped_storage().data_ptr()
                if address not in read:
                    self.made[address] = ("made", index, position)
        return out

    def _described(self, value, read: list):
        if isinstance(value, torch.Tensor):
            address = value.untyped_storage().data_ptr()
            read.append(address)
            made = self.made.get(address)
            if made is None:
                made = ("outside", address)
            return made, value.storage_offset(), value.shape, value.stride(), value.dtype
        if isinstance(value, (list, tuple)):
            return tuple(self._described(item, read) for item in value)
        if isinstance(value, dict):
            return tuple((key, self._described(item, read)) for key, item in value.items())
        if isinstance(value, float) and value != value:
            return "nan"
        if isinstance(value, torch.Generator):  # a graph draws from its generator's state at replay
            return "generator", value.device
        return value

    def check(self, replay: "ReplayTrace") -> None:
        """Raise ReplayDiverged at the first op where `replay` differs from this capture."""
        for index, (captured, replayed) in enumerate(zip(self.ops, replay.ops)):
            if captured != replayed:
                raise ReplayDiverged(f"an emulated graph replay differs from its capture at op {index}, "
                                     f"{replayed[0]}: captured {captured[1:]!r}, replayed {replayed[1:]!r}")
        if len(self.ops) != len(replay.ops):
            raise ReplayDiverged(f"an emulated graph replay ran {len(replay.ops)} ops, its capture {len(self.ops)}")


_INDEX_WRITES = {torch.ops.aten.index_copy_.default, torch.ops.aten.index_copy.default,
                 torch.ops.aten.scatter_.src, torch.ops.aten.scatter.src,
                 torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}
_INDEX_SUMS = {torch.ops.aten.scatter_add_.default, torch.ops.aten.scatter_add.default,
               torch.ops.aten.index_add_.default, torch.ops.aten.index_add.default}
_HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
               torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default, torch.ops.aten.equal.default,
               torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default,
               torch.ops.aten.unique_consecutive.default}


def _check_one_writer(func, args, kwargs, out) -> None:
    """An index write whose repeated indices carry different values: CUDA keeps whichever write lands last, in no
    fixed order, where a CPU keeps the last in index order.  Read back at the indices, the result holds every value
    written exactly when no such pair exists (whatever the order of the writes)."""
    if func in (torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default):  # x[indices] = values
        if _accumulates(func, args, kwargs):
            return  # a sum: _check_one_addend
        indices, values = args[1], args[2]
        found = torch.ops.aten.index.Tensor(out, indices)
        written = values.to(out.dtype).expand_as(found)
    elif func in (torch.ops.aten.index_copy_.default, torch.ops.aten.index_copy.default):
        dim, index, source = args[1:4]
        found, written = out.index_select(dim, index), source
    else:  # scatter: index may be smaller than src in every dimension
        dim, index, source = args[1:4]
        found = out.gather(dim, index)
        written = source[tuple(slice(0, size) for size in index.shape)]
    same = (found == written) | (found != found) & (written != written)  # NaN written where NaN is found
    if not _TOLIST(same.all()):
        raise ReplayDiverged(f"{func} writes different values to one index: on CUDA which one stays is not fixed")


def _accumulates(func, args, kwargs) -> bool:
    """Whether the op is an index_put that adds its values (accumulate=True) rather than writing them."""
    puts = (torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default)
    return func in puts and bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))


def _check_one_addend(func, args, kwargs, out) -> None:
    """A float sum over indices (scatter_add, index_add, index_put with accumulate) that adds two nonzero values to
    one element: CUDA adds them atomically, in no fixed order, so the sum may round otherwise from run to run
    (integers add exactly in any order, and a zero changes nothing).  The same sum of 1 for every nonzero value
    counts the values each element receives."""
    if not (out.is_floating_point() or out.is_complex()):
        return
    counts = torch.zeros(out.shape, dtype=torch.long, device=out.device)
    if func in _INDEX_SUMS:
        dim, index, source = args[1:4]
        add = counts.scatter_add_ if func.name().startswith("aten::scatter") else counts.index_add_
        add(dim, index, (source != 0).long())
    else:
        counts.index_put_(args[1], (args[2] != 0).long(), accumulate=True)
    if _TOLIST((counts > 1).any()):
        raise ReplayDiverged(f"{func} adds two values to one element: on CUDA atomically, in no fixed order, so the "
                             f"sum may round otherwise from run to run")


def _flat_tensors(outputs) -> list:
    """The tensors of a captured function's output: one tensor, a tuple of them, or None."""
    if outputs is None:
        return []
    return [outputs] if isinstance(outputs, torch.Tensor) else [x for x in outputs if isinstance(x, torch.Tensor)]


def generator(device, graphs) -> torch.Generator:
    """The cycle's random numbers: under CUDA graphs the device's default generator, whose state a replay reads
    afresh (captured kernels take their seed and offset from it, and each replay advances it), so replays draw new
    numbers and a seed gives the same tokens with graphs on and off; elsewhere a generator of its own."""
    device = torch.device(device)
    if device.type == "cuda" and isinstance(graphs, Graphs) and not isinstance(graphs, Emulated):
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.Generator(device)


class Transfer:
    """A small device tensor to the host: on CUDA a non-blocking copy into pinned memory and an event per slot,
    so the host can queue more work before it waits."""

    def __init__(self, like: torch.Tensor, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host = [torch.zeros(like.shape, dtype=like.dtype, pin_memory=self.cuda) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)] if self.cuda else None

    def send(self, value: torch.Tensor, slot: int) -> None:
        self.host[slot].copy_(value, non_blocking=self.cuda)
        if self.cuda:  # behind the copy, on the current stream of the device it runs on, which need not be current
            self.events[slot].record(torch.cuda.current_stream(self.device))

    def receive(self, slot: int) -> list[int]:
        if self.cuda:
            self.events[slot].synchronize()
        return self.host[slot].tolist()
