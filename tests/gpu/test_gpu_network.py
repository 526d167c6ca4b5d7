"""The registered model's network file alone (``tasks/domain/classifier_network.py``, torch only) on CPU and GPU.

Every registered version ships this file; a GPU host loading a version must predict the labels a CPU does. Runs
only where torch sees a CUDA device; needs torch alone (no trainlib, Ray, MLflow or Prefect).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU tests run on a GPU machine (docs/gpu.md)", allow_module_level=True)

from tasks.domain import classifier_network  # noqa: E402

pytestmark = pytest.mark.gpu

MEAN, STD = 0.2860, 0.3530  # FashionMNIST's pixel statistics on the 0..1 scale, as a registered version holds them


def _trained_state(architecture: str) -> dict[str, torch.Tensor]:
    """A few training steps on the GPU, so weights and BatchNorm statistics are not the initial ones."""
    torch.manual_seed(0)
    network = classifier_network.build_network(10, architecture).cuda().train()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(5):
        images = torch.rand(64, 1, 28, 28, device="cuda", generator=g)
        labels = torch.randint(0, 10, (64,), device="cuda", generator=g)
        loss = torch.nn.functional.cross_entropy(network(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().cpu() for k, v in network.state_dict().items()}


def _logits(state: dict[str, torch.Tensor], architecture: str, images: torch.Tensor, device: str) -> torch.Tensor:
    network = classifier_network.network_with_weights({k: v.to(device) for k, v in state.items()}, 10, architecture)

    def prepare(batch: torch.Tensor) -> torch.Tensor:
        return ((batch.to(device).float() / 255 - MEAN) / STD).unsqueeze(1)

    return classifier_network.forward_in_batches(network, images, prepare, batch_size=256).float().cpu()


@pytest.mark.parametrize("architecture", sorted(classifier_network.ARCHITECTURES))
@pytest.mark.parametrize(
    "count",
    [64, classifier_network.SCORING_COPY_FROM_IMAGES],  # the network as it is; its scoring copy
    ids=["call", "scoring-copy"],
)
def test_the_network_file_predicts_the_same_labels_on_cpu_and_gpu(architecture, count):
    state = _trained_state(architecture)
    images = torch.randint(0, 256, (count, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    on_cpu = _logits(state, architecture, images, "cpu")
    on_gpu = _logits(state, architecture, images, "cuda")
    assert on_gpu.shape == on_cpu.shape == (count, 10)
    assert torch.isfinite(on_gpu).all()
    scale = on_cpu.abs().max().item()
    torch.testing.assert_close(on_gpu, on_cpu, atol=5e-3 * scale, rtol=5e-3)  # cuDNN's TF32 allowed for
    # The same labels wherever the CPU's top two logits are not a near tie that float rounding could turn over.
    top2 = on_cpu.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-2 * scale
    assert clear.float().mean() > 0.5, "the generated images give near ties: the check would say nothing"
    assert torch.equal(on_gpu.argmax(1)[clear], on_cpu.argmax(1)[clear])
