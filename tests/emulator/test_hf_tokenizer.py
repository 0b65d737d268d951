"""``--tokenizer tokenizer.json``: a real (here: tiny, trained on the spot) byte-level BPE vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.emulator.generation import plan_output
from tokenomy.emulator.tokenizer import WORDS, HFTokenizer

tokenizers = pytest.importorskip("tokenizers")


def _train(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS)] * 50 + ["Hello: the quick brown fox. 12 34!"] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


def test_hf_tokenizer_answers_retokenize_as_a_prefix(tmp_path: Path) -> None:
    tok = HFTokenizer(_train(tmp_path))
    prompt = "Hello: what is in the box?"
    ids = tok.encode(prompt)
    plan = plan_output(tok, ids, max_tokens=15, ignore_eos=True)
    assert tok.encode(prompt + plan.text + " more")[: len(ids) + 15] == ids + plan.token_ids


def test_bad_tokenizer_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        HFTokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="cannot read"):
        HFTokenizer(bad)
