"""The fast tier's end-to-end check (``python -m pytest -m "not slow" tests``): the quick start in small, on the
model the generic tests train. Two processes train a few tiny steps through ``multiproc.py``, and ``inference.py``
writes from the checkpoint they saved."""

import sys

from conftest import TEST_MODEL, bound, finish, start_job, synth_corpus
from model import MODELS


def test_two_processes_train_and_inference_writes_from_their_checkpoint(tmp_path):
    corpus, out = synth_corpus(tmp_path / "corpus", n=12), tmp_path / "out"
    code, output = finish(start_job([sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir",
                                     str(out / "logs"), "train.py", "--config", "config.json", "--model", TEST_MODEL,
                                     "--tiny", "--max-steps", "3", "--dataset-path", str(corpus), "--output-dir",
                                     str(out), "--set", "data.num_workers=0", "--set", "train.val_interval=3"],
                                    tmp_path, nproc=2), timeout=bound(180))
    assert code == 0 and "done: 3 steps" in output and "Traceback" not in output, output[-3000:]
    spec = MODELS[TEST_MODEL]
    if spec.vocode is not None:  # a vocoder: copy-synthesis of a wav of the corpus
        args = ["--wav", str(sorted((corpus / "wavs").glob("*.wav"))[0]), "--output", str(tmp_path / "x.wav")]
    elif TEST_MODEL == "tacotron2":  # text to speech (Griffin-Lim)
        args = ["--text", "Hello.", "--output", str(tmp_path / "x.wav")]
    else:
        return  # a model of the user's own: its inference options are its own (tested by its own tests)
    code, output = finish(start_job([sys.executable, "inference.py", "--checkpoint", str(out / "checkpoint_last.pt"),
                                     "--device", "cpu", *args], tmp_path, nproc=1), timeout=bound(180, 1))
    assert code == 0 and f"wrote {tmp_path / 'x.wav'}" in output, output[-3000:]
    assert (tmp_path / "x.wav").stat().st_size > 1000
