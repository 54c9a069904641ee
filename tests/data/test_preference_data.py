"""Preference records (workbench/data/preference/preference_records.py) and their prepared batches (preference_data.py):
both kinds and their shapes (strings, conversations, an implicit prompt; JSONL, gzip, parquet) read into the
conversations the chat machinery renders; the loss on the answer alone, one BOS; a pair never split across shards; the
sampler resumable; every bad record one line naming its file and line."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from tests.support.chat import pair_records, write_jsonl
from workbench.config import resolve_preset
from workbench.data.chat.chat_data import conversation_pieces, corpus_kind
from workbench.data.corpus.sources import CorpusError
from workbench.data.preference.preference_data import AnswerBatch, PairBatch
from workbench.data.preference.preference_records import PAIRS, PreferenceReader
from workbench.data.preset_data import open_data_corpus, prepare_data
from workbench.data.train_data import IGNORE


def kto_records(n: int) -> list[dict]:
    return [{"prompt": r["prompt"], "completion": r["chosen"] if i % 2 else r["rejected"], "label": bool(i % 2)}
            for i, r in enumerate(pair_records(n))]


def preset(corpus, objective: str = "dpo", *sets: str):
    return resolve_preset("cpu-small", ["model.vocab_size=512", "data.tokenizer_sample_mb=0.3", "model.seq_len=64",
                                        "train.batch_size=4", f"train.objective={objective}", *sets],
                          {"data": {"corpus": str(corpus)}})


def read(path, kind=PAIRS, skip=False):
    from workbench.data.chat.conversations import ChatOptions
    corpus = open_data_corpus(preset(path).data)
    return list(PreferenceReader(kind, ChatOptions(skip_bad=skip)).conversations(corpus.sources))


def test_the_shapes_of_a_pair_read_into_two_conversations(tmp_path):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort: 3 1 2"}]
    recs = [
        {"prompt": "Sort: 3 1 2", "chosen": "1 2 3", "rejected": "3 2 1"},                      # strings
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "1 2 3"}], "rejected": "3 2 1"},
        {"chosen": prompt + [{"role": "assistant", "content": "1 2 3"}],                         # implicit prompt
         "rejected": prompt + [{"role": "assistant", "content": "3 2 1"}]},
        {"prompt": "Sort: 3 1 2", "chosen": "1 2 3", "rejected": "3 2 1", "system": "Be brief."},
    ]
    path = write_jsonl(tmp_path / "p.jsonl", recs)
    convs = read(path)
    assert len(convs) == 8 and [c.tag for c in convs] == [1, 0] * 4
    assert [m.role for m in convs[0].messages] == ["user", "assistant"]
    for k in (2, 4, 6):  # the system prompt, given either way, comes first in both conversations
        assert [m.content for m in convs[k].messages] == ["Be brief.", "Sort: 3 1 2", "1 2 3"]
        assert [m.content for m in convs[k + 1].messages] == ["Be brief.", "Sort: 3 1 2", "3 2 1"]
    assert convs[0].where.endswith(", line 1") and convs[7].where.endswith(", line 4")
    # the same records gzipped and as parquet read the same
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [c.messages for c in read(gz)] == [c.messages for c in convs]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    flat = [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in recs[:1] + recs[3:]]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "p.parquet")
    assert [c.messages[-1].content for c in read(tmp_path / "p.parquet")] == ["1 2 3", "3 2 1"] * 2


@pytest.mark.parametrize("record,line", [
    ({"prompt": "Sort: 2 1", "chosen": "1 2"}, "no 'rejected' field"),
    ({"prompt": "Sort: 2 1", "chosen": "1 2", "rejected": "1 2"}, "chosen and rejected are the same answer"),
    ({"chosen": [{"role": "user", "content": "Sort: 2 1"}, {"role": "assistant", "content": "1 2"}],
      "rejected": [{"role": "user", "content": "Sort: 1 2"}, {"role": "assistant", "content": "2 1"}]},
     "differ before their answers (at message 1)"),
    ({"prompt": "Sort: 2 1", "chosen": 12, "rejected": "2 1"}, "'chosen' is a number"),
])
def test_a_bad_pair_is_one_line_naming_its_file_and_line(tmp_path, record, line):
    good = {"prompt": "Sort: 3 1 2", "chosen": "1 2 3", "rejected": "3 2 1"}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, good, record])
    with pytest.raises(CorpusError) as e:
        read(path)
    msg = str(e.value)
    assert "\n" not in msg and f"{path}, line 3" in msg and line in msg, msg
    assert "data.skip_bad_records" in msg
    assert len(read(path, skip=True)) == 4  # skipped with the option: both good pairs' conversations kept


def test_a_kto_label_must_be_true_or_false(tmp_path):
    recs = [{"prompt": "Sort: 2 1", "completion": "1 2", "label": True},
            {"prompt": "Sort: 2 1", "completion": "2 1", "label": "no"}]
    path = write_jsonl(tmp_path / "k.jsonl", recs)
    with pytest.raises(CorpusError, match=r"line 2: 'label' is str \('no'\), not true or false"):
        read(path, "kto")
    assert corpus_kind(preset(path).data, open_data_corpus(preset(path).data)) == "kto"


def test_prepared_pairs_train_the_answers_alone_and_resume(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", pair_records(60))
    p = preset(path)
    data = prepare_data(p.data, 512, 64, log=lambda m: None, objective="dpo")
    data.check(p)
    assert data.items == 60 and data.kind == PAIRS
    chosen, rejected = conversation_pieces(data, 0, "last_assistant"), conversation_pieces(data, 1, "last_assistant")
    assert [t for t, trained in chosen if trained] == [pair_records(1)[0]["chosen"][0]["content"] + "<|im_end|>"]
    assert [t for t, trained in rejected if trained] == [pair_records(1)[0]["rejected"] + "<|im_end|>"]
    assert chosen[0] == rejected[0] and not chosen[0][1]  # the same prompt, untrained
    s = data.sampler("train", p, seed=5)
    b = s.next_batch()
    assert isinstance(b, PairBatch) and b.inputs.shape == b.rejected_inputs.shape == (4, 64)
    assert b.loss_units() == 4
    # a row's targets are its inputs shifted by one where trained
    for x, y in ((b.inputs, b.targets), (b.rejected_inputs, b.rejected_targets)):
        k = np.flatnonzero(y[0] != IGNORE)
        assert len(k) and (y[0, k[:-1]] == x[0, k[:-1] + 1]).all()
    st = s.state()
    want = [s.next_batch() for _ in range(20)]  # past an epoch (57 train pairs, 4 a batch)
    s2 = data.sampler("train", p, seed=5)
    s2.set_state(st)
    for a, c in zip(want, (s2.next_batch() for _ in range(20))):
        assert (a.inputs == c.inputs).all() and (a.rejected_targets == c.rejected_targets).all()


def test_a_pair_is_never_split_across_shards(tmp_path):
    """With shards of a few hundred characters, every shard holds whole pairs: the prepared corpus equals the one
    prepared in a single shard."""
    from workbench.data.chat.chat_prepare import prepare_chat
    path = write_jsonl(tmp_path / "pairs.jsonl", pair_records(40, seed=4))
    p = preset(path)
    corpus = open_data_corpus(p.data)
    whole = prepare_chat(p.data, corpus, 512, "assistant", None, None, log=lambda m: None, workers=1, kind=PAIRS)
    import shutil
    shutil.rmtree(whole.dir)
    cut = prepare_chat(p.data, corpus, 512, "assistant", None, None, log=lambda m: None, workers=1, kind=PAIRS,
                       shard_chars=150)
    tags = np.fromfile(cut.dir / "tags.bin", dtype=np.uint8)
    assert tags.tolist() == [1, 0] * 40
    assert cut.index["conversations"] == 80


def test_kto_batches_carry_labels_and_mismatched_kl_rows(tmp_path):
    path = write_jsonl(tmp_path / "kto.jsonl", kto_records(40))
    p = preset(path, "kto")
    data = prepare_data(p.data, 512, 64, log=lambda m: None, objective="kto")
    b = data.sampler("train", p, seed=1).next_batch()
    assert isinstance(b, AnswerBatch) and set(b.desirable.tolist()) <= {0, 1}
    for r in range(4):  # the KL row: this prompt, the previous item's answer (its trained tokens alone)
        kl = b.kl_targets[r][b.kl_targets[r] != IGNORE]
        prev = b.targets[r - 1][b.targets[r - 1] != IGNORE]
        assert kl.tolist() == prev.tolist()


def test_one_bos_in_each_answer_rendered_through_a_template_that_adds_it(tmp_path, hf_chat_model):
    """The model's template writes {{ bos_token }}; each of a pair's conversations is rendered whole and encoded
    without the tokenizer's own specials, so it holds exactly one BOS, first (OpenRLHF #393's double BOS)."""
    from workbench.data.text.tokenizer import load_tokenizer
    tok = load_tokenizer(hf_chat_model)
    assert tok.bos_id is not None
    path = write_jsonl(tmp_path / "pairs.jsonl", pair_records(10))
    p = preset(path, "dpo", f"data.tokenizer={hf_chat_model}")
    data = prepare_data(p.data, 4096, 64, log=lambda m: None, objective="dpo")
    for c in range(len(data.offsets) - 1):
        ids = np.asarray(data.tokens[data.offsets[c]:data.offsets[c + 1]])
        assert ids[0] == tok.bos_id and int((ids == tok.bos_id).sum()) == 1


def test_records_of_another_kind_later_in_the_corpus_are_refused(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", pair_records(4))
    b = write_jsonl(tmp_path / "b.jsonl", kto_records(4))
    p = resolve_preset("cpu-small", ["train.objective=dpo"], {"data": {"corpus": [str(a), str(b)]}})
    with pytest.raises(CorpusError, match="holds labelled answers .* not preference pairs"):
        list(PreferenceReader(PAIRS).conversations(open_data_corpus(p.data).sources))
    assert json.loads(a.read_text().splitlines()[0])["chosen"]
