"""bench/gpu_peers.py's harness in its CPU smoke mode, both modes, against a peer model.py with nanoGPT's interface
written here (CI has no nanoGPT checkout; the bench imports whatever model.py it is given): every contender is run
and reported, the sizes agree, a profile prints, and the time-to-loss mode trains both on the same tokens to a final
loss."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# nanoGPT's model.py interface (GPTConfig; GPT(config) with forward(idx, targets) -> (logits, loss) and
# configure_optimizers(weight_decay, learning_rate, betas, device_type)) and its shape: fused qkv, a 4x GELU MLP,
# LayerNorm, learned positions, the output layer tied to the embedding.
PEER = '''
import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias), nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.mlp_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        print("number of parameters: %.2fM" % (sum(p.numel() for p in self.parameters()) / 1e6,))

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        ps = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
        use_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        print(f"using fused AdamW: {use_fused}")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **(dict(fused=True) if use_fused else {}))
'''


def bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cp = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_peers.py"), *args], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    return cp


def test_gpu_peers_smoke_against_a_peer_model(tmp_path):
    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "model.py").write_text(PEER)

    # throughput: nanoGPT's row and two workbench contenders, the profile of one
    out = tmp_path / "speed.json"
    cp = bench("--nanogpt", str(peer), "--smoke", "--json", str(out), "--wb", "shipped=gpu-24gb",
               "--wb", "plain-loss=gpu-24gb hardware.chunked_loss=false", "--profile", "plain-loss")
    r = json.loads(out.read_text())
    assert r["done"] and r["mode"] == "throughput" and r["device"] == "cpu" and r["nanogpt"] == str(peer)
    rows = {c["name"]: c for c in r["contenders"]}
    assert list(rows) == ["nanogpt", "shipped", "plain-loss"]
    d = r["dims"]
    # nanoGPT's matrices (12 dim^2 a layer: qkv, out, the 4x MLP) and its tied output layer; workbench's the same with
    # ffn_hidden = 8/3 dim
    assert d["ffn_hidden"] * 3 == 8 * d["dim"]
    want = d["layers"] * 12 * d["dim"] ** 2 + d["vocab"] * d["dim"]
    assert {c["matrix_params"] for c in rows.values()} == {want}, rows
    for c in rows.values():
        assert c["tokens_per_s"] > 0 and c["ms_per_step"] > 0 and c["mfu"] > 0, c
        assert c["flops_per_token"] == 6 * want + 12 * d["layers"] * d["dim"] * d["seq"]
        assert math.isclose(c["vs_nanogpt"], c["tokens_per_s"] / rows["nanogpt"]["tokens_per_s"])
        assert math.isfinite(c["last_loss"])
    assert rows["nanogpt"]["estimate_mib"] is None
    assert rows["shipped"]["estimate_mib"] > 0 and rows["plain-loss"]["estimate_mib"] > 0
    # the contender's own override reached its build: the CPU's auto chunks the loss, false does not
    assert "fused loss" in rows["shipped"]["settings"] and "plain loss" in rows["plain-loss"]["settings"]
    assert rows["plain-loss"]["loss_chunk_tokens"] == 0 < rows["shipped"]["loss_chunk_tokens"]
    assert "-- profile of plain-loss" in cp.stdout and "top kernels" in cp.stdout
    table = cp.stdout[cp.stdout.index("contender "):]
    assert all(name in table for name in rows), cp.stdout

    # time to loss: the same tokens, evals at the same steps, nanoGPT's final loss the target
    out = tmp_path / "ttl.json"
    cp = bench("--nanogpt", str(peer), "--smoke", "--time-to-loss", "--steps", "20", "--eval-every", "10",
               "--work", str(tmp_path / "work"), "--json", str(out))
    r = json.loads(out.read_text())
    assert r["done"] and r["mode"] == "time-to-loss"
    assert Path(r["tokens"]).stat().st_size == 2 * (r["train_tokens"] + r["val_tokens"])  # uint16
    nano, wb = r["contenders"]
    assert (nano["name"], wb["name"]) == ("nanogpt", "shipped")
    for c in (nano, wb):
        assert [e[0] for e in c["evals"]] == [0, 10, 20]
        assert c["evals"][-1][2] < c["evals"][0][2], c["evals"]  # it learned
        assert c["final_val_loss"] == c["evals"][-1][2] and c["train_s"] > 0 and c["tokens_per_s"] > 0
    assert r["target"] == nano["final_val_loss"]
    assert nano["time_to_target_s"] is not None and 0 < nano["time_to_target_s"] <= nano["train_s"] + 1e-9
    assert wb["time_to_target_s"] is None or 0 < wb["time_to_target_s"] <= wb["train_s"] + 1e-9  # (sums of floats)
    assert f"nanoGPT's final val loss {nano['final_val_loss']:.4f}" in cp.stdout
    assert "shipped: reached it " in cp.stdout
