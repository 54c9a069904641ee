"""A corpus that is one very large document (many public dumps are a single .txt) is prepared and opened in
bounded memory: finding where validation starts reads the token file in blocks, through the file (the pages
of a map, once touched, stay in the process's memory), only near the split, and not at all when the corpus is
one document; a boundary that would hold out far more or less than val_fraction is not taken."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from tests.support.cli import REPO

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, psutil
    from workbench.data.text.tokens import split_point
    path, documents = sys.argv[1], (None if sys.argv[2] == "none" else int(sys.argv[2]))
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    me = psutil.Process()
    before = me.memory_info().rss
    at = split_point(tokens, 1, 0.1, 64, documents)
    print(at, me.memory_info().rss - before)
""")


def test_the_split_of_a_large_document_reads_blocks_not_the_whole_file(tmp_path):
    n = 60_000_000  # 120 MB of uint16 tokens: two documents, the first 1,001 tokens long

    def write(ends: list[int]) -> None:
        tokens = np.memmap(tmp_path / "tokens.bin", dtype=np.uint16, mode="w+", shape=(n,))
        tokens[:] = 7
        tokens[ends] = 1
        tokens.flush()

    write([1000])

    def split(documents: str) -> tuple[int, int]:
        cp = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "tokens.bin"), documents], cwd=REPO,
                            capture_output=True, text=True, check=True)
        at, grew = cp.stdout.split()
        return int(at), int(grew)

    at, grew = split("none")   # its one boundary would hold out 99.998 %: the split is at 10 % of the tokens
    assert at == n - n // 10
    assert grew < 16 * 2**20, f"the split held {grew / 2**20:.0f} MiB of a 114 MiB token file"
    at, grew = split("1")      # one document: no boundary to look for
    assert at == n - n // 10 and grew < 4 * 2**20
    write([1000, n - 9_000_000])  # a boundary that holds out 15 %: taken (whole documents in validation)
    assert split("none")[0] == n - 9_000_000 + 1
    write([1000, n - 4_000_000])  # 6.7 %, after the target: taken
    assert split("none")[0] == n - 4_000_000 + 1
    write([1000, n - 2_000_000])  # 3.3 %: less than half the share, so the split is at the target
    assert split("none")[0] == n - n // 10
