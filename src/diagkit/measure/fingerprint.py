"""Changed or unchanged without a copy: an integer fingerprint of a tensor's bits."""

from __future__ import annotations

import torch

from .kernels import dense


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}


class Fingerprinter:
    """Two 32-bit integer sums over a tensor's raw bits: a plain one and a position-weighted one.

    Changed/unchanged without a copy of the tensor: a change of any single element always
    changes the plain sum (integer addition mod 2^32 loses nothing of a 32-bit difference), and
    several changes that cancel in both sums have a chance of about 2^-64. Integer sums do not
    depend on summation order, so the result is the same on every device and thread count.
    Work is chunked so the extra memory is two chunk-sized buffers per device, whatever the
    tensor's size. Comparison is bitwise: +0.0 -> -0.0 counts as a change.
    """

    CHUNK = 1 << 20

    def __init__(self):
        self._weights: dict[torch.device, torch.Tensor] = {}
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def _buffers(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._weights:
            gen = torch.Generator().manual_seed(0x5EED)  # never the global RNG
            w = torch.randint(-2**31, 2**31 - 1, (self.CHUNK,), generator=gen,
                              dtype=torch.int32).bitwise_or_(1)
            self._weights[device] = w.to(device)
            self._scratch[device] = torch.empty(self.CHUNK, dtype=torch.int32, device=device)
        return self._weights[device], self._scratch[device]

    def __call__(self, t: torch.Tensor) -> list[torch.Tensor]:
        t = dense(t.detach())
        if not t.is_contiguous():
            t = t.contiguous()  # rare for parameters: a temporary copy
        device = t.device
        if t.numel() == 0:
            zero = torch.zeros((), dtype=torch.int32, device=device)
            return [zero, zero]
        flat = t.reshape(-1).view(_INT_VIEW.get(t.element_size(), torch.uint8))
        weights, scratch = self._buffers(device)
        plain = torch.zeros((), dtype=torch.int32, device=device)
        placed = torch.zeros((), dtype=torch.int32, device=device)
        for start in range(0, flat.numel(), self.CHUNK):
            chunk = flat[start:start + self.CHUNK]
            n = chunk.numel()
            plain += chunk.sum(dtype=torch.int32)
            torch.mul(chunk, weights[:n], out=scratch[:n])
            # Which chunk a value sits in matters too: fold the chunk number in.
            placed += scratch[:n].sum(dtype=torch.int32) * (2 * (start // self.CHUNK) + 1)
        return [plain, placed]

    def clear(self) -> None:
        self._weights.clear()
        self._scratch.clear()
