"""Matcha-TTS on the corpora a run reads: its frame budgets resumed bit for bit after SIGTERM and through 2 -> 1 -> 2
processes, a run resumed past a validation at its last step, and a 4-voice corpus in each layout the project reads
(``data.format=auto``), each voice its own."""

import os

import pytest
from conftest import (ROOT, VOICE_LAYOUTS, assert_four_voices, assert_same_weights, assert_speaks_each_voice,
                      demo_corpus, four_voice_argv, frame_budgets_resume_through_2_1_2, metrics_rows, synth_corpus,
                      train_in_process)
from test_matcha_run import two_rank_run


@pytest.mark.slow
def test_frame_budgets_resume_bit_exactly_after_sigterm_and_read_each_utterance_once_through_2_1_2(tmp_path,
                                                                                              monkeypatch):
    """Matcha-TTS's own batching (``data.batching`` null: its recipe's frame budgets) on 2 gloo ranks, 21 training
    clips of 0.3 to 2 s in budgets of 350 mel frames, the recipe's EMA kept: a run stopped by SIGTERM inside its first
    epoch resumes on 2 processes to the same batches, the same three losses (``t`` and the noise drawn from each
    rank's saved generator) and the same weights and EMA as the run that went on; resumed on 1 process for a step,
    then on 2 again, the epoch reads each training utterance once (:func:`conftest.frame_budgets_resume_through_2_1_2`)."""
    corpus = synth_corpus(tmp_path / "corpus", n=23, seconds=1.0, spread=(0.3, 2.0))  # 21 train, 2 val: uneven
    common = ["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny", "--dataset-path",
              str(corpus), "--set", "data.max_frames=350", "--set", "train.log_interval=1"]
    frame_budgets_resume_through_2_1_2(tmp_path, monkeypatch, common, [f"SYN-{i:04d}" for i in range(1, 22)])


@pytest.mark.slow
def test_a_run_that_validated_at_its_last_step_resumed_with_more_steps_repeats_the_run_that_went_on(tmp_path):
    """Matcha-TTS's validation loss draws ``t`` and noise: from a fork of the random streams, so a run that ended
    (and validated) at step 2, resumed with ``--max-steps 4``, trains steps 3 and 4 to the same losses, weights and
    EMA as the run of 4 steps (in this process: what is proven is the run's stream, not the ranks')."""
    corpus = synth_corpus(tmp_path / "corpus", n=12, seconds=1.0)
    common = ["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny", "--dataset-path",
              str(corpus), "--set", "data.num_workers=0", "--set", "train.log_interval=1"]
    train_in_process([*common, "--output-dir", str(tmp_path / "whole"), "--max-steps", "4"])
    said = [train_in_process([*common, "--output-dir", str(tmp_path / "extended"), "--max-steps", str(steps)])
            for steps in (2, 4)]
    assert "resumed from" in said[1], said[1][-2000:]
    assert [(row["loss"], row["losses"]) for row in metrics_rows(tmp_path / "extended")] == \
        [(row["loss"], row["losses"]) for row in metrics_rows(tmp_path / "whole")]
    assert_same_weights([tmp_path / "whole", tmp_path / "extended"])

@pytest.mark.slow
@pytest.mark.parametrize("layout", VOICE_LAYOUTS)
def test_a_four_speaker_matcha_trains_on_each_layout_and_speaks_each_voice(layout, tmp_path, tmp_path_factory):
    """A 4-voice demo corpus in each layout, read by ``data.format=auto`` (8 utterances, 2 a voice), then tiny
    Matcha-TTS on it: for filelists the shared run of 2 steps on 2 gloo ranks (:func:`test_matcha_run.two_rank_run`),
    for the others 1 step in this process (the ranks' path proven once, each reader on its own). ``speakers.json`` and
    the checkpoint hold the 4 voices, sorted, and the model a 4-row speaker table; for filelists,
    ``inference.py --speaker`` speaks each voice differently from the same seeded noise."""
    if layout == "filelist":
        out, said = two_rank_run(tmp_path_factory)
        said = "".join(said)
    else:
        out = tmp_path / "run"
        said = train_in_process(four_voice_argv("matcha", demo_corpus(tmp_path_factory, layout, speakers=4, n=8), out,
                                                layout))
    voices = assert_four_voices("matcha", layout, out, said)
    if layout == "filelist":
        assert_speaks_each_voice(out / "checkpoint_last.pt", voices, tmp_path, "--text", "The quick fox.", "--seed",
                                 "1", "--n-timesteps", "2")
