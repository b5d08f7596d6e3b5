"""What PyTorch's rules for CUDA graphs and its caching allocator ask of the decoder, checked on a CPU.

- A tensor made in a graph's warm-up is allocated on the warm-up's side stream, one made in its capture in the
  graphs' private pool.  The allocator lends a block to one stream (another stream's use of it needs
  record_stream), and a pool's blocks to its graphs' replays: a tensor the decoder keeps (a cache, a cycle's
  state, a graph's output) must be made before either.
- A float sum over repeated indices (scatter_add_, index_add_, index_put_ with accumulate) is a set of atomic adds
  on CUDA, in no fixed order: the sum, and a token drawn from it, may change from run to run.
- A capture records the kernels of the current device's capturing stream, and draws from the default generator of
  the device current when it begins: graphs capture and replay with the decoder's device current, which need not
  be the process's, and a cycle's result is awaited on that device's stream.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from eagle_mdsd import cycle, drafters, eagle3, engine, graphs, head, tree_specs, verification

from tiny import tiny_target

PROMPT = [1, 2, 3, 0]


class Making(TorchDispatchMode):
    """Keeps every tensor an op of the block makes in new memory (not a view of, nor a write into, its inputs), so
    that no tensor made later takes its address."""

    def __init__(self, made: list):
        super().__init__()
        self.made = made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        read = {tensor.untyped_storage().data_ptr() for tensor in pytree.tree_leaves((args, kwargs))
                if isinstance(tensor, torch.Tensor)}
        self.made += [tensor for tensor in pytree.tree_leaves(out) if isinstance(tensor, torch.Tensor)
                      and tensor.numel() and tensor.untyped_storage().data_ptr() not in read]
        return out


class Recorded(graphs.Emulated):
    """Emulated graphs that keep what their warm-ups and captures make: on CUDA, memory of a side stream and of
    the graphs' pool."""

    def __init__(self):
        super().__init__()
        self.made = []

    def _warm_up(self, function, inputs):
        with Making(self.made):
            return super()._warm_up(function, inputs)

    def _capture(self, function, buffers):
        with Making(self.made):
            return super()._capture(function, buffers)


def kept(decoder) -> dict:
    """Name -> each tensor a decoder keeps between calls: its caches' buffers, its cycles' state and plans, its
    graphs' outputs.  Not the caches' `slots`: each phase sets them before its forward reads them."""
    found = {}

    def walk(name, value):
        if isinstance(value, torch.Tensor):
            found[name] = value
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{name}[{index}]", item)
        elif isinstance(value, (cycle.State, cycle.TreeBuffers, drafters.StaticPlan, drafters.Level, graphs.Transfer)):
            for key, item in vars(value).items():
                walk(f"{name}.{key}", item)

    for index, cache in enumerate(filter(None, decoder.caches)):
        walk(f"caches[{index}].buffer", cache.buffer)
    for method, kept_cycle in decoder.cycles.items():
        for key, value in vars(kept_cycle).items():
            if key not in ("decoder", "target_cache", "head_cache"):
                walk(f"{method} cycle.{key}", value)
    for key, (_, _, outputs) in decoder.graphs.entries.items():
        walk(f"output of {key[0]} graph", outputs)
    return found


@pytest.mark.parametrize("spec, kind, prompt", [("eagle_default+lookup", "eagle", [5]),
                                                ("eagle2:total_tokens=16,depth=5,top_k=4", "eagle", [5]),
                                                ("chain2", "eagle3", [5]), ("eagle_default", "eagle", PROMPT)])
def test_no_tensor_a_decoder_keeps_is_made_in_a_warm_up_or_a_capture(spec, kind, prompt):
    # A one-token prompt leaves the head no pair to read before the first cycle: its cache is first written in the
    # draft phase's warm-up, so it must be allocated when it is made.
    target = tiny_target(vocab=16, layers=4)
    draft_head = eagle3.random_head(target, draft_vocab_size=8) if kind == "eagle3" else head.random_head(target)
    decoder = engine.Decoder(target, draft_head, tree_specs.load(spec, "cuda"), cuda_graphs="emulate")
    decoder.graphs = Recorded()
    for temperature in (0.0, 1.0):
        decoder.generate(prompt, 8, temperature)
    made = {tensor.untyped_storage().data_ptr() for tensor in decoder.graphs.made}
    inside = [name for name, tensor in kept(decoder).items()
              if tensor.numel() and tensor.untyped_storage().data_ptr() in made]
    assert decoder.graphs.entries and not inside, inside


@pytest.mark.parametrize("write", ["scatter_add_", "index_add_", "index_put_"])
def test_a_float_sum_of_two_values_at_one_index_is_caught(write):
    # CUDA adds them atomically, in no fixed order; one value an index, zeros and integers add the same in any order.
    def step(values, index):
        out = torch.zeros(2, 4, dtype=values.dtype)
        if write == "scatter_add_":
            return out.scatter_add_(1, index[None].expand(2, -1), values[None].expand(2, -1))
        if write == "index_add_":
            return out.index_add_(1, index, values[None].expand(2, -1))
        return out.index_put_((torch.ones(3, dtype=torch.long), index), values, accumulate=True)

    checked = graphs.Checked()
    checked.run("apart", step, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([2, 0, 1]))
    checked.run("zeros", step, torch.tensor([0.1, 0.0, 0.0]), torch.tensor([1, 1, 1]))
    checked.run("integers", step, torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]))
    with pytest.raises(graphs.ReplayDiverged, match="adds two values to one element"):
        checked.run("together", step, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1, 1, 0]))


@pytest.mark.parametrize("name", ["kseq", "rrs_w"])
def test_a_plan_writes_a_repeated_draft_s_weights_as_one_sum(name):
    # K-SEQ gives each copy of a draft a weight of its own; the plan sums them in a fixed order before one write.
    torch.manual_seed(0)
    p, q = torch.rand(5, 6).softmax(-1), torch.rand(5, 6).softmax(-1)
    drafts = torch.tensor([[3, 3, 1], [0, 2, 2], [4, 4, 4], [1, 5, 1], [2, 0, 3]])
    verifier = verification.get(name)
    plan = graphs.Checked().run("plan", verifier.plan, p, q, drafts)
    assert torch.allclose(plan.sum(-1), torch.ones(5)) and (plan >= 0).all()
    assert torch.allclose(plan, verifier.plan(p.double(), q.double(), drafts).float(), atol=1e-6)


class FakeCuda:
    """torch.cuda's devices, streams, graphs and events as graphs.py calls them, on a CPU: the current device, each
    device's current stream, and the stream capturing, if any.  torch.cuda.graph, as torch's, makes its default
    capture stream once, on the device current at the first capture, and a stream context makes its stream's
    device current."""

    class Stream:
        def __init__(self, device: int, default: bool = False):
            self.device, self.default = device, default

        def wait_stream(self, other):
            pass

    def __init__(self):
        self.device, self.current, self.capturing, self.default_capture = 0, {}, None, None

    def install(self, monkeypatch):
        fake = self

        class CUDAGraph:
            def replay(self):
                fake.replays.append(self.stream)

        class Event:
            def record(self, stream=None):
                self.stream = fake.current_stream() if stream is None else stream

            def synchronize(self):
                pass

        self.replays, self.cleared_before_capture = [], False

        def clear_cublas_workspaces():
            fake.cleared_before_capture = fake.capturing is None

        monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", clear_cublas_workspaces, raising=False)
        for name, value in (("Stream", lambda device=None: self.Stream(self._index(device))),
                            ("current_stream", self.current_stream), ("stream", self.stream), ("device", self.on),
                            ("graph", self.graph), ("CUDAGraph", CUDAGraph), ("Event", Event),
                            ("graph_pool_handle", lambda: "pool"), ("synchronize", lambda device=None: None)):
            monkeypatch.setattr(torch.cuda, name, value)

    def _index(self, device) -> int:
        if isinstance(device, int):
            return device
        return self.device if device is None or torch.device(device).index is None else torch.device(device).index

    def current_stream(self, device=None):
        return self.current.setdefault(self._index(device), self.Stream(self._index(device), default=True))

    @contextlib.contextmanager
    def on(self, device):
        previous, self.device = self.device, self._index(device)
        try:
            yield
        finally:
            self.device = previous

    @contextlib.contextmanager
    def stream(self, stream):
        previous = self.current_stream(stream.device)
        with self.on(torch.device("cuda", stream.device)):
            self.current[stream.device] = stream
            try:
                yield
            finally:
                self.current[stream.device] = previous

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None):
        if stream is None:
            self.default_capture = self.default_capture or self.Stream(self.device)
            stream = self.default_capture
        with self.stream(stream):
            self.capturing, graph.stream = stream, stream
            try:
                yield
            finally:
                self.capturing = None


def test_graphs_capture_and_replay_on_their_device(monkeypatch):
    # With cuda:0 current, graphs of a decoder on cuda:1 then of one on cuda:2: each warm-up runs on a side stream
    # of the graphs' device, each capture records that device's work, and each replay launches it there.
    fake = FakeCuda()
    fake.install(monkeypatch)
    for device in (1, 2):
        calls = []

        def phase(x):
            stream = fake.current_stream(device)  # where the kernels of tensors on `device` go
            calls.append((fake.device, stream.device, stream.default, stream is fake.capturing))
            return x + 1

        captured = graphs.Graphs(torch.device("cuda", device))
        for _ in range(2):
            captured.run(("verify", 1, 0), phase, torch.ones(2))
        assert calls == [(device, device, False, False)] * 2 + [(device, device, False, True)]
        assert fake.cleared_before_capture  # cuBLAS's workspaces: the capture's own, in the graphs' pool
        assert [stream.device for stream in fake.replays] == [device] * 2 and fake.device == 0
        fake.replays.clear()


def test_a_transfer_awaits_its_copy_on_the_stream_of_its_device(monkeypatch):
    # The copy of a result on cuda:1 runs on cuda:1's stream: an event recorded on the current device's (cuda:0)
    # would let the host read the buffer before the copy lands.
    fake = FakeCuda()
    fake.install(monkeypatch)
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *args, pin_memory=False, **kwargs: zeros(*args, **kwargs))
    transfer = graphs.Transfer(zeros(3, dtype=torch.long), "cuda:1")
    transfer.send(torch.arange(3), 1)
    assert transfer.events[1].stream is fake.current_stream(1) and transfer.receive(1) == [0, 1, 2]


def test_a_target_spread_over_devices_is_not_captured():
    """A capture records one device's stream: a target that --device auto spreads over GPUs runs eagerly."""
    one = torch.nn.Linear(2, 2)
    spread = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    assert graphs.resolve("auto", "cuda:0", one) and graphs.resolve("compile", "cuda:0", one)
    assert not graphs.resolve("auto", "cuda:0", spread) and not graphs.resolve("auto", "cpu", one)
