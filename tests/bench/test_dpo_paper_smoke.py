"""bench/dpo_paper.py --tiny runs the whole pipeline for real at a toy scale: a tiny model pretrained and
chat-tuned through the CLI, `workbench pairs` on its own samples with the lexicon reward, a DPO, a DPO + NLL and a
Preferred-FT run from it, each measured (reward and sequence KL to the SFT model) on held-out prompts; the table
has a row for each, and the SFT model's KL to itself is 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_tiny_bench_measures_every_arm(tmp_path):
    cp = subprocess.run([sys.executable, str(ROOT / "bench" / "dpo_paper.py"), "--tiny", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    out = cp.stdout
    assert "| model | seeds | mean reward (± sd over seeds) | sequence KL to SFT, nats (± sd) |" in out
    lines = out.splitlines()
    first = lines.index(next(ln for ln in lines if ln.startswith("| model")))
    table = [ln for ln in lines[first + 2:] if ln.startswith("| ")][:4]     # the table's rows, its header left out
    assert lines[first + 2:first + 6] == table                                 # ... which are the four lines after it
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table}
    labels = list(rows)
    assert labels[0] == "SFT model (the reference, the origin)"
    assert [lb.split(": ", 1)[1] for lb in labels[1:]] == [
        "DPO beta 0.1", "DPO + NLL (pref_sft_weight 1), beta 0.1", "Preferred-FT (SFT on the chosen samples)"]
    for label, cells in rows.items():
        assert cells[0] == "1", (label, cells)                        # one seed each, none failed
        reward, kl = float(cells[1].split(" ± ")[0]), float(cells[2].split(" ± ")[0])
        assert -1 <= reward <= 1 and kl == kl                         # the lexicon's range; a number
    assert float(rows[labels[0]][2].split(" ± ")[0]) == 0.0          # the SFT model's KL to itself
    # the matched-KL table: Preferred-FT's one checkpoint (its KL and reward), the two DPO arms' rewards there
    matched = [ln.split("|")[1:-1] for ln in lines if ln.startswith("| lr 0.0002, step 4 |")]
    assert len(matched) == 1 and len(matched[0]) == 5, matched
    assert "reward vs KL on the held-out prompts" in out and "sequence KL(pi || pi_SFT), nats" in out
    assert "  P  Preferred-FT (SFT on the chosen samples)" in out                # the plot's legend
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["origin"]["kl"] == 0.0
    assert all(len(res["arms"][arm]) == 1 for arm in res["arms"])
    # the trained arms moved away from the reference: a KL that is not exactly 0
    assert all(res["arms"][arm][0][-1]["kl"] != 0.0 for arm in res["arms"])
    pairs = [json.loads(x) for x in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert pairs and all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
