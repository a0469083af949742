"""Build a small LJSpeech-layout corpus offline with a local text-to-speech engine (flite or espeak-ng).

    python -m scripts.make_demo_corpus --output data/demo --num-utterances 60

The result, ``DIR/metadata.csv`` (``id|text|text``) and ``DIR/wavs/LJ_DEMO_0001.wav`` ... (16-bit mono PCM at
``--sampling-rate`` Hz), loads with ``utils.data.corpus.read_ljspeech``: the whole pipeline can be smoke-tested without
downloading LJSpeech. Sentences spoken again (more utterances than sentences) get another voice or speaking rate, so no
two utterances are the same recording; ``--seed`` jitters the speaking rate (+-5 %) reproducibly.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import librosa
import numpy as np
import torch
from tqdm import tqdm

from utils.data.audio import load_wav, save_wav
from utils.data.corpus import DataError

ENGINES = ("flite", "espeak-ng")
NO_ENGINE_MESSAGE = "neither flite nor espeak-ng is installed (apt-get install flite)"
FLITE_VOICES = ("slt", "rms", "awb", "kal16")  # 16 kHz voices worth varying (awb_time speaks clock times; kal: 8 kHz)
ESPEAK_VOICES = ("en-us", "en-us+f3", "en-gb", "en-gb+f2")
ESPEAK_DEFAULT_WPM = 175
SPEEDS = (1.0, 0.87, 1.12)  # speaking-rate factors, >1 is faster; one round of voices per factor
RATE_JITTER = 0.05  # each utterance's rate is also scaled by a seeded factor in [0.95, 1.05]

DEMO_SENTENCES = (
    "The morning train left the station exactly on time.", "A small boat drifted slowly across the quiet harbor.",
    "She wrote the numbers on the board, one after another.", "Nobody expected the old bridge to hold so much weight.",
    "Please close the window before the rain comes in.", "The library opens at nine and closes at six in the evening.",
    "He counted twelve sheep, then fell asleep in his chair.", "Fresh bread was sold in the market every Saturday.",
    "The committee will meet again next Thursday afternoon.", "Bright lights flickered along the edge of the river.",
    "Why would anyone leave a piano in the middle of a field?", "The letter arrived three weeks after it was sent.",
    "Farmers watched the sky and hoped for a gentle spring.", "A careful reader notices the smallest changes in tone.",
    "The engine coughed twice and then started with a roar.", "Her brother painted the fence a pale shade of green.",
    "Thunder rolled over the hills long into the night.", "They followed the narrow path until it reached the sea.",
    "The museum keeps a map that is four hundred years old.", "Every student was asked to read one chapter aloud.",
    "The clock in the tower struck midnight, and the town went still.",
    "A warm wind carried the smell of pine through the valley.", "The doctor said that a long walk would do him good.",
    "Could you tell me the way to the nearest post office?",
    "Seven ships sailed from the port in the first week of May.",
    "The kettle whistled while the guests took off their coats.",
    "Snow covered the roofs and muffled every sound in the street.",
    "The judge listened closely and asked only one question.",
    "Our neighbor grows tomatoes, beans, and a few tall sunflowers.",
    "The recording began with a short silence and a soft cough.",
    "Measured carefully, the table was just over two meters long.",
    "The children laughed when the dog chased its own tail.",
    "Workers repaired the road before the winter storms arrived.",
    "An old photograph showed the house as it looked in 1920.",
    "The speaker paused, smiled, and continued with her story.",
    "Heavy clouds gathered above the mountains in the west.", "The price of coffee rose sharply during the dry season.",
    "He kept his promise, even though it cost him a great deal.",
    "At the end of the hall stood a door painted bright red.",
    "The festival ended with music, dancing, and fireworks over the lake.",
)


class DemoCorpusError(RuntimeError):
    """The demo corpus cannot be built (no engine, bad arguments, a synthesis failure)."""


@dataclasses.dataclass(frozen=True)
class Voice:
    """Who speaks an utterance: the ``engine`` (flite or espeak-ng), its ``name`` (``None``: the engine's default) and
    the ``speed`` factor (>1 is faster)."""

    engine: str
    name: Optional[str]
    speed: float = 1.0


def pick_engine(engine: str) -> str:
    """The engine to use: ``auto`` is flite if installed, else espeak-ng.

    Raises:
        DemoCorpusError: an unknown engine, or none installed that ``engine`` names.
    """
    if engine == "auto":
        for name in ENGINES:
            if shutil.which(name):
                return name
        raise DemoCorpusError(NO_ENGINE_MESSAGE)
    if engine not in ENGINES:
        raise DemoCorpusError(f"unknown engine '{engine}' (choose auto, flite or espeak-ng)")
    if not shutil.which(engine):
        raise DemoCorpusError(f"{engine} is not installed (apt-get install {engine})")
    return engine


def _flite_voices() -> list[Optional[str]]:
    """The voices of :data:`FLITE_VOICES` this flite build has (``flite -lv``), or ``[None]`` (its default)."""
    result = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False)
    available = set(result.stdout.replace("Voices available:", "").split())
    return [voice for voice in FLITE_VOICES if voice in available] or [None]


def _synth_command(voice: Voice, text_file: Path, wav_file: Path) -> list[str]:
    """The command that speaks ``text_file`` into ``wav_file`` with ``voice`` (a file, so that a sentence starting with
    '-' cannot be taken for an option)."""
    if voice.engine == "flite":
        return ["flite", *(["-voice", voice.name] if voice.name else []), "--setf",
                f"duration_stretch={1.0 / voice.speed:.3f}", "-f", str(text_file), "-o", str(wav_file)]
    return ["espeak-ng", "-v", voice.name or "en-us", "-s", str(round(ESPEAK_DEFAULT_WPM * voice.speed)),
            "-w", str(wav_file), "-f", str(text_file)]


def read_sentences(path: Path) -> list[str]:
    """Non-blank lines of a UTF-8 text file, one sentence each.

    Raises:
        DemoCorpusError: the file is missing, not UTF-8, has no sentences, or a line (named) holds '|'.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DemoCorpusError(f"sentences file not found: {path}") from None
    except UnicodeDecodeError as err:
        raise DemoCorpusError(f"sentences file {path} is not UTF-8 text ({err})") from None
    for number, line in enumerate(lines, start=1):
        if "|" in line:
            raise DemoCorpusError(f"{path}:{number}: sentences must not contain '|' (the metadata separator)")
    sentences = [line.strip() for line in lines if line.strip()]
    if not sentences:
        raise DemoCorpusError(f"sentences file has no sentences: {path}")
    return sentences


def _prepare_output(output: Path, overwrite: bool) -> None:
    """Create ``output/wavs``; refuse a folder that already holds a corpus unless ``overwrite``."""
    if output.exists() and not output.is_dir():
        raise DemoCorpusError(f"--output {output} exists and is not a folder")
    if (output / "metadata.csv").exists():
        if not overwrite:
            raise DemoCorpusError(f"{output} already holds a metadata.csv; pass --overwrite to replace the corpus")
        (output / "metadata.csv").unlink()  # first: a failed rebuild never leaves metadata naming deleted wavs
        for old in (output / "wavs").glob("LJ_DEMO_*.wav"):
            old.unlink()
    (output / "wavs").mkdir(parents=True, exist_ok=True)


def _check_arguments(sentences: list[str], num_utterances: int, sampling_rate: int) -> None:
    """Raises :class:`DemoCorpusError` for no sentences, one that is empty or holds '|' or a line break, fewer than one
    utterance or a sampling rate that is not positive."""
    if not sentences:
        raise DemoCorpusError("no sentences given")
    for sentence in sentences:
        if "|" in sentence or "\n" in sentence or not sentence.strip():
            raise DemoCorpusError(f"sentence {sentence!r} is empty or holds '|' or a line break")
    if num_utterances < 1:
        raise DemoCorpusError(f"--num-utterances must be at least 1, got {num_utterances}")
    if sampling_rate <= 0:
        raise DemoCorpusError(f"--sampling-rate must be positive, got {sampling_rate}")


def _speak(voice: Voice, text: str, utt_id: str, scratch: Path, sampling_rate: int) -> torch.Tensor:
    """``text`` spoken by ``voice`` (files in ``scratch``): float samples ``(samples,)`` in [-1, 1] at ``sampling_rate``
    Hz.

    Raises:
        DemoCorpusError: the engine failed or wrote an unusable wav (naming ``utt_id``).
    """
    engine, text_file, raw_wav = voice.engine, scratch / "text.txt", scratch / "raw.wav"
    text_file.write_text(text + "\n", encoding="utf-8")
    result = subprocess.run(_synth_command(voice, text_file, raw_wav), capture_output=True, text=True, check=False)
    if result.returncode != 0 or not raw_wav.is_file():
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DemoCorpusError(f"{engine} failed on {utt_id} (exit {result.returncode}): {detail[0]}")
    try:
        audio = load_wav(raw_wav, sampling_rate)
    except DataError as err:
        raise DemoCorpusError(f"{engine} wrote an unusable wav for {utt_id}: {err}") from None
    raw_wav.unlink()
    return audio


def make_corpus(args: argparse.Namespace, sentences: Sequence[str]) -> Path:
    """Speak ``args.num_utterances`` of ``sentences`` into an LJSpeech-layout corpus at ``args.output`` (created;
    ``args.overwrite`` replaces its ``LJ_DEMO_*.wav`` and ``metadata.csv``); returns it as a Path. ``args``: the
    command line (:func:`main`'s options: ``output``, ``num_utterances``, ``engine``, ``sampling_rate``, ``seed``,
    ``overwrite``).

    Utterance ``i`` (id ``LJ_DEMO_{i+1:04d}``) speaks ``sentences[i % len(sentences)]``; each pass over the sentences
    uses the engine's next voice/speed (all voices at normal speed, then slower, then faster), and every utterance's
    speed is jittered by up to 5 % with ``random.Random(args.seed)``. The engine's output (8-22.05 kHz) is resampled
    with librosa to ``args.sampling_rate`` Hz and written as 16-bit mono PCM.

    Raises:
        DemoCorpusError: no engine, bad arguments, an existing corpus without ``overwrite``, or the engine failing
            (the message names the utterance).
    """
    output, sampling_rate, sentences = Path(args.output), args.sampling_rate, list(sentences)
    _check_arguments(sentences, args.num_utterances, sampling_rate)
    engine = pick_engine(args.engine)
    names = _flite_voices() if engine == "flite" else list(ESPEAK_VOICES)
    voices = [Voice(engine, name, speed) for speed in SPEEDS for name in names]  # each at speed 1, slower, faster
    rng = random.Random(args.seed)
    _prepare_output(output, args.overwrite)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # The resampler's first use loads librosa and its kernels (up to a minute): done here, so the bar moves at once.
        print("loading the resampler (librosa) ...", end=" ", flush=True)
        librosa.resample(np.zeros(1024, dtype=np.float32), orig_sr=16000, target_sr=sampling_rate)
        print("done", flush=True)
        for i in tqdm(range(args.num_utterances), desc=f"speaking with {engine}", unit="utt"):
            utt_id = f"LJ_DEMO_{i + 1:04d}"
            text = sentences[i % len(sentences)].strip()
            voice = voices[(i // len(sentences)) % len(voices)]
            voice = dataclasses.replace(voice, speed=voice.speed * rng.uniform(1.0 - RATE_JITTER, 1.0 + RATE_JITTER))
            audio = _speak(voice, text, utt_id, Path(tmp), sampling_rate)
            save_wav(output / "wavs" / f"{utt_id}.wav", audio, sampling_rate)
            rows.append(f"{utt_id}|{text}|{text}\n")
    (output / "metadata.csv").write_text("".join(rows), encoding="utf-8")
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line entry point; returns the exit status (0 done, 1 error printed as one ``ERROR:`` line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path, help="corpus folder to create")
    parser.add_argument("--sentences", type=Path,
                        help="UTF-8 text file, one sentence a line (default: 40 built-in sentences)")
    parser.add_argument("--num-utterances", type=int, help="number of wavs (default: one per sentence)")
    parser.add_argument("--engine", choices=("auto",) + ENGINES, default="auto")
    parser.add_argument("--sampling-rate", type=int, default=22050, help="Hz of the written wavs")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the speaking-rate jitter")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --output")
    args = parser.parse_args(argv)
    try:
        sentences = read_sentences(args.sentences) if args.sentences else list(DEMO_SENTENCES)
        if args.num_utterances is None:
            args.num_utterances = len(sentences)
        output = make_corpus(args, sentences)
    except DemoCorpusError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.num_utterances} utterances to {output} (metadata.csv + wavs/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
