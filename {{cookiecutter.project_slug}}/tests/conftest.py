"""Put the project root on sys.path so tests can import its modules (model, distributed, ...)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def synth_corpus(root, n: int = 24, seconds: float = 0.6, sampling_rate: int = 22050, seed: int = 0):
    """Write an LJSpeech-layout corpus of ``n`` voiced-sounding clips (harmonics of a gliding f0 under an
    envelope, plus a little noise) with short transcripts; returns the folder. No TTS engine needed."""
    from pathlib import Path

    import numpy as np
    import soundfile as sf

    root = Path(root)
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again"]
    lines = []
    for i in range(n):
        t = np.arange(int(seconds * sampling_rate * rng.uniform(0.8, 1.2))) / sampling_rate
        f0 = rng.uniform(90, 220) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
        phase = 2 * np.pi * np.cumsum(f0) / sampling_rate
        voice = sum(np.sin(k * phase) / k for k in range(1, 8))
        envelope = np.sin(np.pi * t / t[-1]) ** 2
        audio = 0.3 * envelope * voice / 2.6 + 0.005 * rng.standard_normal(t.size)
        utt = f"SYN-{i + 1:04d}"
        sf.write(root / "wavs" / f"{utt}.wav", audio.astype(np.float32), sampling_rate, subtype="PCM_16")
        text = " ".join(rng.choice(words, size=rng.integers(2, 6))).capitalize() + "."
        lines.append(f"{utt}|{text}|{text}\n")
    (root / "metadata.csv").write_text("".join(lines))
    return root
