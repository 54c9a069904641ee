"""One reader of records (JSON lines, parquet) under documents, conversations and eval tasks: a bad line, a JSON
array, a record that is not an object, an unreadable parquet file and a truncated stream say the same thing,
one line naming the file and the line, whichever reader meets them; each reader adds only its own fix."""

from __future__ import annotations

import gzip
import json
import lzma
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workbench.data.chat.conversations import ChatOptions, ChatReader
from workbench.data.corpus.documents import open_corpus
from workbench.data.corpus.record_reader import RecordReader, Stats
from workbench.data.corpus.sources import CorpusError, expand
from workbench.data.tasks.task_files import TaskError, read_task_file

GOOD = {"query": "2+2", "choices": ["4", "5"], "gold": 0,
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "text": "a doc"}


def _corpus(path: Path) -> None:
    list(open_corpus(str(path)).pieces())


def _chat(path: Path) -> None:
    list(ChatReader(ChatOptions()).conversations(expand(str(path))))


def _task(path: Path) -> None:
    read_task_file(path)


READERS = {"documents": (_corpus, "corpus file", CorpusError), "chat": (_chat, "corpus file", CorpusError),
           "tasks": (_task, "task", TaskError)}

# what is in the file's second line -> what the message says after "<label> <file>, line 2: "
BAD_LINES = {
    "not JSON": (b'{"text": oops}', "not valid JSON (Expecting value)"),
    "not UTF-8": (b'{"text": "caf\xe9"}', "not UTF-8 text (save the file as UTF-8)"),
    "not an object": (b"[1, 2]", "a record is a JSON object, not a list"),
}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_bad_line_says_the_same_in_every_reader(tmp_path, reader, case):
    read, label, error = READERS[reader]
    line, said = BAD_LINES[case]
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + line + b"\n")
    with pytest.raises(error) as e:
        read(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{label} {path}, line 2: {said}; "), msg


@pytest.mark.parametrize("reader", list(READERS))
def test_a_json_array_and_a_truncated_stream_say_the_same_in_every_reader(tmp_path, reader):
    read, label, error = READERS[reader]
    array = tmp_path / "a.jsonl"
    array.write_text(json.dumps([GOOD, GOOD]) + "\n")
    with pytest.raises(error, match=rf"^{label} {array} is one JSON array, not JSON lines \(one object a line\); "
                                    r"convert it, e\.g\. `jq -c"):
        read(array)
    for name, compress in (("t.jsonl.gz", gzip.compress), ("t.jsonl.xz", lzma.compress)):
        path = tmp_path / name
        path.write_bytes(compress((json.dumps(GOOD) + "\n").encode() * 5000)[:-60])
        with pytest.raises(error, match=rf"^{label} {path} is truncated or corrupt \((gz|xz): .*\); download or "
                                        "compress it again$"):
            read(path)


@pytest.mark.parametrize("reader", ["documents", "chat"])
def test_a_file_that_is_not_parquet_says_so(tmp_path, reader):
    read, label, error = READERS[reader]
    path = tmp_path / "c.parquet"
    path.write_bytes(b"not parquet at all" * 20)
    with pytest.raises(error, match=rf"^{label} {path} is not a readable parquet file \("):
        read(path)


def test_records_name_their_line_or_row_and_count_what_they_read(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(f"{json.dumps(GOOD)}\n\n{json.dumps({'text': 'b'})}\n")
    table = tmp_path / "r.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), table)
    stats = Stats()
    reader = RecordReader(stats=stats)
    got = [(w, w.number, r) for w, r in reader.records(expand(str(jsonl))[0])]
    assert got == [(f"corpus file {jsonl}, line 1", 1, GOOD), (f"corpus file {jsonl}, line 3", 3, {"text": "b"})]
    assert stats.bytes_read == jsonl.stat().st_size
    where = pickle.loads(pickle.dumps(got[1][0]))   # a conversation carries it to the encoding processes
    assert (where, where.number) == (f"corpus file {jsonl}, line 3", 3)
    rows = list(reader.records(expand(str(table))[0], columns=["text", "missing"]))
    assert rows == [(f"corpus file {table}, row 1", {"text": "a"}), (f"corpus file {table}, row 2", {"text": "b"})]
    assert reader.parquet_columns(expand(str(table))[0]) == {"text": "string", "n": "int64"}
    assert reader.first(expand(str(table))[0]) == {"text": "a", "n": 1}


def test_skipped_bad_records_are_counted_with_the_first_one_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(f'{json.dumps(GOOD)}\n{{broken\n"a string"\n{json.dumps(GOOD)}\n')
    stats = Stats()
    recs = list(RecordReader(skip_bad=True, stats=stats).records(expand(str(path))[0]))
    assert len(recs) == 2 and stats.skipped_records == 2
    assert stats.first_bad_record == f"corpus file {path}, line 2: not valid JSON (Expecting property name enclosed " \
                                     "in double quotes)"
