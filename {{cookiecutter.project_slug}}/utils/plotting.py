"""Pictures of attention alignments, mel spectrograms and stop gates (PNG files or TensorBoard), and audio clips for
TensorBoard.

Figures are plain :class:`matplotlib.figure.Figure` objects drawn with the Agg canvas: no GUI backend and no pyplot
state, so nothing is left open between calls and the functions are safe in DataLoader workers or on headless servers.
Pass a figure to ``SummaryWriter.add_figure`` or turn it into an array with :func:`figure_to_array`. Audio goes through
:func:`add_audio`; :func:`fixed_random_state` makes a model's sampling draw the same noise at every validation, and
:func:`first_time` lets a clip that never changes (the ground truth) be written once.
"""

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


def _to_numpy(x: ArrayLike, ndim: int, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-D, got shape {x.shape}")
    return x


def _new_figure(size: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    return figure


def _finish(figure: Figure, path: Optional[PathLike]) -> Figure:
    figure.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    return figure


def plot_alignment(alignment: ArrayLike, path: Optional[PathLike] = None, title: Optional[str] = None) -> Figure:
    """Heat map of attention weights, encoder steps (text) up, decoder steps (frames) across.

    Args:
        alignment: ``(enc_steps, dec_steps)`` weights (a model's ``(T, L)`` alignment transposed).
        path: save a PNG there (parent folders are created) when given.
        title: figure title.

    Returns:
        The figure.

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
    figure = _new_figure(size)
    axes = figure.add_subplot()
    image = axes.imshow(data, aspect="auto", origin="lower", interpolation="none")
    figure.colorbar(image, ax=axes)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    return _finish(figure, path)


def plot_gate(gate_target: ArrayLike, gate_pred: ArrayLike, path: Optional[PathLike] = None,
              title: Optional[str] = None) -> Figure:
    """Stop-gate target (0/1) and predicted stop probability ``(frames,)`` over decoder steps.

    Args:
        gate_target: ``(frames,)`` 0/1 target.
        gate_pred: ``(frames,)`` predicted probability (apply ``sigmoid`` to logits first).

    Raises:
        ValueError: either input is not 1-D.
    """
    target = _to_numpy(gate_target, 1, "gate_target")
    pred = _to_numpy(gate_pred, 1, "gate_pred")
    figure = _new_figure((8, 3))
    axes = figure.add_subplot()
    axes.scatter(np.arange(len(target)), target, color="green", marker="+", s=4, label="target")
    axes.scatter(np.arange(len(pred)), pred, color="red", marker=".", s=4, label="predicted")
    axes.set_ylim(-0.05, 1.05)
    axes.set_xlabel("frame")
    axes.set_ylabel("stop probability")
    axes.legend(loc="center left")
    if title:
        axes.set_title(title)
    return _finish(figure, path)


def figure_to_array(figure: Figure) -> np.ndarray:
    """Render ``figure`` to an RGB ``uint8`` array ``(H, W, 3)`` (e.g. for ``add_image(..., dataformats="HWC")``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def add_audio(writer: Any, tag: str, audio: ArrayLike, step: int, sampling_rate: int) -> bool:
    """Add a mono clip to TensorBoard: ``writer.add_audio(tag, (1, samples), step, sample_rate=sampling_rate)``.

    Args:
        writer: a ``SummaryWriter``.
        tag: the clip's name in TensorBoard's audio tab.
        audio: ``(samples,)`` float samples in [-1, 1] (tensor on any device, or numpy array); values outside are
            clipped.
        step: the training step it belongs to.
        sampling_rate: Hz.

    Returns:
        ``True`` if the clip was added; ``False`` (with a warning, training goes on) when it holds NaN or infinite
        values, e.g. a diverged model's output.

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


_WRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # writer -> tags that first_time has seen


def first_time(writer: Any, tag: str) -> bool:
    """``True`` the first time it is asked about ``tag`` for this ``writer`` (this process), ``False`` after.

    For media that do not change during a run (the ground-truth audio of the fixed validation utterance): written at the
    first validation only. A resumed run has a new writer, so it writes them once more.
    """
    seen = _WRITTEN.setdefault(writer, set())
    if tag in seen:
        return False
    seen.add(tag)
    return True


@contextlib.contextmanager
def fixed_random_state(device: torch.device, seed: int = 0) -> Iterator[None]:
    """Run the block with the CPU's random generator, and a CUDA ``device``'s, seeded with ``seed``; restore them after.

    Sampling done for a validation clip (WaveGlow's Gaussian noise, Tacotron2's pre-net dropout) then draws the same
    numbers at every validation, so two clips differ only by what the model learned in between; and the training run's
    own random stream (dropout, crops) is left exactly as it was.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    index = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield
