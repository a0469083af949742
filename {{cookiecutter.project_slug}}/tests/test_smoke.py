"""The fast tier's end-to-end check (``python -m pytest -m "not slow" tests``): the quick start in small, on the
model the generic tests train. Two processes train a few tiny steps through ``multiproc.py`` (conftest's
:func:`quick_start_run`, made once per session: test_wiring reads what the same run's ranks recorded), and for a
vocoder ``inference.py`` writes from the checkpoint they saved (its ``main``, in this process: the launch proven here
is the training's; what inference proves is that the checkpoint the two processes saved is read and written from)."""

from conftest import QUICK_STEPS, TEST_MODEL, run_main

from models import MODELS
from utils.training.setup import recipe_line


def test_two_processes_train_and_inference_writes_from_their_checkpoint(quick_start_run, tmp_path):
    folder, code, output = quick_start_run
    corpus, out = folder / "corpus", folder / "out"
    assert code == 0 and f"done: {QUICK_STEPS} steps" in output and "Traceback" not in output, output[-3000:]
    assert recipe_line(MODELS[TEST_MODEL]) in output, output[-3000:]  # the start-up says which recipe it gets
    inference_group = MODELS[TEST_MODEL].inference
    if inference_group is None or inference_group.vocode is None:
        return  # not a vocoder: its inference options are its own, run by its own test file's fast tests
    args = ["--wav", str(sorted((corpus / "wavs").glob("*.wav"))[0]), "--output", str(tmp_path / "x.wav")]
    done = run_main("inference", "--checkpoint", str(out / "checkpoint_last.pt"), "--device", "cpu", *args)
    assert f"wrote {tmp_path / 'x.wav'}" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "x.wav").stat().st_size > 1000
