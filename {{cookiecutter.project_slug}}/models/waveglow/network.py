"""WaveGlow's config section, the flow (audio <-> Gaussian noise, conditioned on mels), its loss and its fast path
(Prenger et al., ICASSP 2019; sizes and defaults: NVIDIA's reference implementation)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from model import Batch
from modules.waveglow import WN, Invertible1x1Conv, at_least_fp32
from utils.config import Config, ModelSection


class WaveGlowConfig(ModelSection):
    """The ``waveglow`` section (defaults: NVIDIA's LJSpeech model). ``n_group`` audio samples are squeezed into
    channels; every ``n_early_every`` flows, ``n_early_size`` channels leave early. ``segment_length``: the training
    crop (samples). ``sigma``: the prior's standard deviation in training, ``infer_sigma`` at inference.
    ``mel_on_device``: the workers only decode and crop; the mels are computed on the device (one batched STFT)."""

    n_flows: int = Field(12, ge=1)
    n_group: int = Field(8, ge=2)
    n_early_every: int = Field(4, ge=1)
    n_early_size: int = Field(2, ge=0)
    wn_layers: int = Field(8, ge=1)
    wn_channels: int = Field(256, ge=1)
    wn_kernel_size: int = Field(3, ge=1)
    sigma: float = Field(1.0, ge=0)
    infer_sigma: float = Field(0.6, ge=0)
    segment_length: int = Field(16000, ge=1)
    batch_size: int = Field(12, ge=1)
    mel_on_device: bool = False


class WaveGlow(nn.Module):
    """A normalising flow from audio to Gaussian noise, conditioned on mels of ``n_mels`` channels upsampled to audio
    rate by a transposed convolution of stride ``hop_length`` and kernel ``win_length`` (samples). Raises ValueError for
    an odd ``n_group``, or early outputs that would leave fewer than 2 channels."""

    def __init__(self, cfg: WaveGlowConfig, n_mels: int, hop_length: int, win_length: int):
        super().__init__()
        if cfg.n_group % 2:
            raise ValueError(f"waveglow.n_group must be even, got {cfg.n_group}")
        self.cfg = cfg
        self.upsample = nn.ConvTranspose1d(n_mels, n_mels, win_length, stride=hop_length)
        self.flows = nn.ModuleList()
        self.convs = nn.ModuleList()
        channels = cfg.n_group
        for k in range(cfg.n_flows):
            if k > 0 and k % cfg.n_early_every == 0:
                channels -= cfg.n_early_size
            if channels < 2:
                raise ValueError(f"waveglow: {cfg.n_flows} flows with n_early_every={cfg.n_early_every} and "
                                 f"n_early_size={cfg.n_early_size} leave {channels} channels; need >= 2")
            self.convs.append(Invertible1x1Conv(channels))
            self.flows.append(WN(channels // 2, n_mels * cfg.n_group, cfg.wn_layers, cfg.wn_channels,
                                 cfg.wn_kernel_size))
        self.n_remaining = channels

    def _grouped_mel(self, mel: torch.Tensor, samples: int) -> torch.Tensor:
        """The mel ``(B, n_mels, frames)`` upsampled and folded to ``(B, n_mels * n_group, samples // n_group)``."""
        g = self.cfg.n_group
        mel = self.upsample(mel)[:, :, :samples]
        batch, n_mels, _ = mel.shape
        return mel.unfold(2, g, g).permute(0, 1, 3, 2).reshape(batch, n_mels * g, -1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Map audio to noise: ``batch`` ``{"mel": (B, n_mels, frames), "audio": (B, samples)}``, samples a multiple of
        ``n_group`` and at most ``frames * hop_length`` -> ``(z, log_s_list, log_det_list)``: ``z`` ``(B, n_group,
        samples // n_group)``, each coupling's ``log s`` and each 1x1 convolution's log-determinant."""
        audio = batch["audio"]
        g = self.cfg.n_group
        cond = self._grouped_mel(batch["mel"], audio.shape[1])
        x = audio.unfold(1, g, g).transpose(1, 2)  # (B, n_group, samples // n_group)
        early, log_s_list, log_det_list = [], [], []
        for k, (conv, wn) in enumerate(zip(self.convs, self.flows)):
            if k > 0 and k % self.cfg.n_early_every == 0:
                early.append(x[:, :self.cfg.n_early_size])
                x = x[:, self.cfg.n_early_size:]
            x, log_det = conv(x)
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = wn(x_a, cond)
            shift, log_s = out[:, :half], out[:, half:]
            x = torch.cat([x_a, torch.exp(log_s) * x_b + shift], dim=1)
            log_s_list.append(log_s)
            log_det_list.append(log_det)
        early.append(x)
        return torch.cat(early, dim=1), log_s_list, log_det_list

    def reverse(self, mel: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Invert :meth:`forward`: noise ``z`` ``(B, n_group, samples // n_group)``, laid out as :meth:`forward` returns
        it (early outputs first) -> audio ``(B, samples)``; ``reverse(mel, forward(batch)[0])`` gives
        ``batch["audio"]`` back up to rounding."""
        batch, _, steps = z.shape
        cond = self._grouped_mel(mel, steps * self.cfg.n_group)
        offset = z.shape[1] - self.n_remaining  # channels that left early sit before this offset
        x = z[:, offset:]
        for k in reversed(range(self.cfg.n_flows)):
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = self.flows[k](x_a, cond)
            shift, log_s = out[:, :half], out[:, half:]
            x = self.convs[k].inverse(torch.cat([x_a, (x_b - shift) * torch.exp(-log_s)], dim=1))
            if k > 0 and k % self.cfg.n_early_every == 0:
                offset -= self.cfg.n_early_size
                x = torch.cat([z[:, offset:offset + self.cfg.n_early_size], x], dim=1)
        return x.transpose(1, 2).reshape(batch, -1)

    @torch.no_grad()
    def infer(self, mel: torch.Tensor, sigma: float = 0.6) -> torch.Tensor:
        """Vocode: mel ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)``, not clamped (as NVIDIA's
        ``infer``): :meth:`reverse` from Gaussian noise of standard deviation ``sigma``, drawn in NVIDIA's order (the
        remaining channels, then each early output's from the last flow back), so a seeded run gives its audio."""
        batch, steps = mel.shape[0], mel.shape[2] * self.upsample.stride[0] // self.cfg.n_group
        n_early = (self.cfg.n_flows - 1) // self.cfg.n_early_every  # flows k > 0 with k % n_early_every == 0
        draws = [torch.randn(batch, channels, steps, device=mel.device, dtype=mel.dtype)
                 for channels in [self.n_remaining] + [self.cfg.n_early_size] * n_early]
        return self.reverse(mel, sigma * torch.cat(draws[::-1], dim=1))


class WaveGlowLoss(nn.Module):
    """Negative log-likelihood of the flow per audio sample (NVIDIA's reference normalisation):
    ``(sum z^2 / (2 sigma^2) - sum log s - sum log|det W|) / (B * samples)``."""

    def __init__(self, sigma: float = 1.0):
        super().__init__()
        self.sigma = sigma

    def forward(self, outputs, batch: Batch) -> torch.Tensor:
        z, log_s_list, log_det_list = outputs
        z = at_least_fp32(z)  # half-precision sums of squares lose too much
        log_s_total = sum(at_least_fp32(log_s).sum() for log_s in log_s_list)
        nll = (z * z).sum() / (2 * self.sigma ** 2) - log_s_total - sum(log_det_list)
        return nll / z.numel()


def optimize_for_training(model: nn.Module, cfg: Config, **compile_kwargs) -> nn.Module:
    """WaveGlow's fast path: ``torch.compile`` of the whole flow in place (``dynamic=False`` by default: one graph for
    the crop's shape), before the DDP wrapper; returns ``model``. Not per WN block: weight norm gives every convolution
    a class of its own, so each block would compile separately. Float32 losses agree with eager to ~1e-7 relative.
    Raises TypeError where ``model`` is not a :class:`WaveGlow`."""
    if not isinstance(model, WaveGlow):
        raise TypeError(f"waveglow optimize_for_training expects a WaveGlow, got {type(model).__name__}")
    compile_kwargs.setdefault("dynamic", False)
    model.compile(**compile_kwargs)
    return model
