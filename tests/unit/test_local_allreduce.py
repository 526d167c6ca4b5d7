"""DDP's shared-memory allreduce for the CPU ranks of one node (trainlib/torch/_local_allreduce.py).

Real processes form a real gloo group (a file store: no port to race for); each checks the
shared-memory sum against gloo's own allreduce of the same tensors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import faulthandler, os, sys, time
    faulthandler.dump_traceback_later(90, exit=True)  # a hang ends with every thread's stack in the output
    import torch, torch.distributed as dist
    from trainlib.torch import _local_allreduce

    rank, world, store, root, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    _local_allreduce._SHM_ROOT = root  # the test's own folder: what is left behind is the test's to see
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)

    if mode == "sums":
        # 4 KB chunks: every tensor below spans several, and the two halves of the buffer turn over.
        allreduce = _local_allreduce.LocalAllreduce.create(chunk_bytes=4096)
        assert os.listdir(root) == [], os.listdir(root)  # unlinked once every rank opened them
        torch.manual_seed(rank)
        for dtype, size in ((torch.float32, 10_000), (torch.float64, 7), (torch.bfloat16, 3000), (torch.float32, 0),
                            (torch.float32, 1024)):
            mine = torch.randn(size).to(dtype)
            expected = mine.clone()
            dist.all_reduce(expected)
            got = allreduce.allreduce_(mine.clone())
            if world == 2:  # a + b == b + a: the same bits as gloo's
                assert torch.equal(got, expected), (dtype, size)
            else:
                low = dtype == torch.bfloat16  # 8 bits of mantissa: another order of 3 additions differs more
                assert torch.allclose(got.double(), expected.double(), rtol=0.02 if low else 1e-6, atol=0.05 if low else 1e-6)
            gathered = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(gathered, got)
            assert all(torch.equal(g, got) for g in gathered)  # and every rank holds the same sum
        print("SUMS OK", flush=True)

    elif mode == "ddp":
        def build():
            torch.manual_seed(0)
            return torch.nn.parallel.DistributedDataParallel(
                torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 26 * 26, 64)),
                gradient_as_bucket_view=True, bucket_cap_mb=0.05)  # several buckets (the first holds 1 MB)
        torch.manual_seed(100 + rank)
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        grads = {}
        for variant in ("gloo", "shared", "user"):
            model = build()
            if variant != "gloo":
                _local_allreduce.install(model, _local_allreduce.LocalAllreduce.create(chunk_bytes=8192))
            calls = []
            if variant == "user":  # the user's hook, registered on the returned model, replaces trainlib's
                def counting_hook(state, bucket):
                    calls.append(bucket.index())
                    return dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future().then(
                        lambda fut: fut.value()[0])
                model.register_comm_hook(None, counting_hook)
                assert [hook.__name__ for hook, _ in model._comm_hooks] == ["counting_hook"]
            for _ in range(2):  # DDP's first backward uses one bucket, the second the sized ones
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
            grads[variant] = [p.grad.clone() for p in model.parameters()]
            if variant == "user":
                assert len(calls) == 3 and calls[1:] == [0, 1], calls
        for a, b, c in zip(grads["gloo"], grads["shared"], grads["user"]):
            assert torch.equal(a, b) and torch.equal(a, c)
        print("DDP OK", flush=True)

    elif mode == "stuck":
        allreduce = _local_allreduce.LocalAllreduce.create(chunk_bytes=4096, timeout_s=1)
        if rank == 0:
            t = time.monotonic()
            try:
                allreduce.allreduce_(torch.ones(10))
            except RuntimeError as exc:
                print("ERROR", f"{time.monotonic() - t:.1f}", exc, flush=True)
        else:
            time.sleep(4)  # never joins the sum

    elif mode == "no-room":
        if rank == 1:  # this rank cannot open what rank 0 made: no rank uses shared memory
            def fail(*args, **kwargs):
                raise OSError(28, "No space left on device")
            _local_allreduce.LocalAllreduce._open = classmethod(fail)
        allreduce = _local_allreduce.LocalAllreduce.create(chunk_bytes=4096)
        print("CREATED", allreduce is not None, os.listdir(root), flush=True)
    dist.destroy_process_group()
""")


def _run(tmp_path, mode: str, world: int = 2) -> list[str]:
    root = tmp_path / "shm"
    root.mkdir()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(rank), str(world), str(tmp_path / "store"), str(root),
                               mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(world)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    assert os.listdir(root) == []  # nothing left behind
    return outs


@pytest.mark.parametrize("world", [2, 3])
def test_the_shared_memory_sum_matches_gloo_across_chunks_and_dtypes(tmp_path, world):
    assert all("SUMS OK" in out for out in _run(tmp_path, "sums", world))


def test_ddp_gradients_are_the_same_bits_as_with_gloo_and_a_users_hook_replaces_it(tmp_path):
    assert all("DDP OK" in out for out in _run(tmp_path, "ddp"))


def test_a_rank_that_never_joins_is_an_error_naming_it_after_the_timeout(tmp_path):
    out = _run(tmp_path, "stuck")[0]
    assert "ERROR" in out and "waited 1 s for rank 1" in out, out
    assert float(out.split("ERROR ")[1].split()[0]) < 3.5  # the timeout, not gloo's 30 minutes


def test_when_any_rank_cannot_map_the_buffer_no_rank_uses_it(tmp_path):
    outs = _run(tmp_path, "no-room")
    assert all("CREATED False []" in out for out in outs), outs
