"""Pictures of attention alignments, mel spectrograms and stop gates (PNG files or TensorBoard), and audio clips for
TensorBoard. Figures are plain :class:`matplotlib.figure.Figure` objects on the Agg canvas: no GUI backend and no
pyplot state, so nothing stays open between calls, and DataLoader workers and headless servers are safe."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

import numpy as np
import torch

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn: importing it costs ~1 s per process
    from matplotlib.figure import Figure

ArrayLike = Union[torch.Tensor, np.ndarray]
PathLike = Union[str, Path]
_WRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # writer -> tags that first_time has seen


def _to_numpy(x: ArrayLike, ndim: int, what: str) -> np.ndarray:
    x = np.asarray(x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
    if x.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-D, got shape {x.shape}")
    return x


def _new_axes(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    return figure.add_subplot()


def _finish(axes: Any, xlabel: str, ylabel: str, title: Optional[str], path: Optional[PathLike]) -> Figure:
    """Label the axes, lay the figure out and save it as a PNG at ``path`` when given."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    figure = axes.figure
    figure.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    return figure


def plot_alignment(alignment: ArrayLike, path: Optional[PathLike] = None, title: Optional[str] = None) -> Figure:
    """Heat map of attention weights ``(enc_steps, dec_steps)`` (a model's ``(T, L)`` alignment transposed): encoder
    steps (text) up, decoder steps (frames) across. Saved as a PNG at ``path`` when given (folders created).

    Raises:
        ValueError: ``alignment`` is not 2-D.
    """
    return _image(_to_numpy(alignment, 2, "alignment"), (6, 4), "decoder step", "encoder step", path, title)


def plot_spectrogram(mel: ArrayLike, path: Optional[PathLike] = None, title: Optional[str] = None) -> Figure:
    """Image of a log-mel spectrogram ``(n_mels, frames)``, low bands at the bottom.

    Raises:
        ValueError: ``mel`` is not 2-D.
    """
    return _image(_to_numpy(mel, 2, "mel spectrogram"), (8, 3), "frame", "mel channel", path, title)


def _image(data, size, xlabel: str, ylabel: str, path: Optional[PathLike], title: Optional[str]) -> Figure:
    """A 2-D array as an image with a colour bar, row 0 at the bottom."""
    axes = _new_axes(size)
    axes.figure.colorbar(axes.imshow(data, aspect="auto", origin="lower", interpolation="none"), ax=axes)
    return _finish(axes, xlabel, ylabel, title, path)


def plot_gate(gate_target: ArrayLike, gate_pred: ArrayLike, path: Optional[PathLike] = None,
              title: Optional[str] = None) -> Figure:
    """Stop-gate target (0/1) and predicted stop probability (``sigmoid`` of the logits), each ``(frames,)``, over
    decoder steps.

    Raises:
        ValueError: either input is not 1-D.
    """
    target = _to_numpy(gate_target, 1, "gate_target")
    pred = _to_numpy(gate_pred, 1, "gate_pred")
    axes = _new_axes((8, 3))
    axes.scatter(np.arange(len(target)), target, color="green", marker="+", s=4, label="target")
    axes.scatter(np.arange(len(pred)), pred, color="red", marker=".", s=4, label="predicted")
    axes.set_ylim(-0.05, 1.05)
    axes.legend(loc="center left")
    return _finish(axes, "frame", "stop probability", title, path)


def figure_to_array(figure: Figure) -> np.ndarray:
    """Render ``figure`` to an RGB ``uint8`` array ``(H, W, 3)`` (e.g. for ``add_image(..., dataformats="HWC")``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def add_audio(writer: Any, tag: str, audio: ArrayLike, step: int, sampling_rate: int) -> bool:
    """Add a mono clip ``(samples,)`` (a tensor on any device or an array, clipped to [-1, 1]) at ``sampling_rate`` Hz
    to a ``SummaryWriter``: ``True``; ``False`` with a warning when it holds NaN or inf (a diverged model's output).

    Raises:
        ValueError: ``audio`` is not 1-D or is empty.
    """
    clip = _to_numpy(audio, 1, f"audio '{tag}'")
    if clip.size == 0:
        raise ValueError(f"audio '{tag}' is empty")
    if not np.isfinite(clip).all():
        warnings.warn(f"step {step}: audio '{tag}' holds NaN or infinite values; not added to TensorBoard")
        return False
    writer.add_audio(tag, torch.from_numpy(np.clip(clip, -1.0, 1.0)).unsqueeze(0), step, sample_rate=sampling_rate)
    return True


def first_time(writer: Any, tag: str) -> bool:
    """``True`` the first time it is asked about ``tag`` for this ``writer`` (this process), ``False`` after: media
    that never change in a run (the ground-truth audio) are written once (once more by a resumed run's new writer)."""
    seen = _WRITTEN.setdefault(writer, set())
    first = tag not in seen
    seen.add(tag)
    return first


@contextlib.contextmanager
def fixed_random_state(device: torch.device, seed: int = 0) -> Iterator[None]:
    """Run the block with the CPU's random generator, and a CUDA ``device``'s, seeded with ``seed``; restore them after.
    A validation clip's sampling (WaveGlow's noise, Tacotron2's pre-net dropout) then draws the same numbers every time,
    so clips differ only by what the model learned, and the training's own random stream is left as it was."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    index = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield
