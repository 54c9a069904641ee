"""workbench's sentencepiece tokenizer in other formats: its pieces read from the protobuf, the
equivalent Hugging Face ``tokenizer.json`` and the tokenizer config files (for ``export --format hf``),
and the pieces GGUF embeds (``workbench.interop.gguf_export``)."""

from __future__ import annotations

import struct
from typing import Any, Iterator

from workbench.errors import WorkbenchError


class TokenizerFormatError(WorkbenchError):
    pass


def tokenizer_files(seq_len: int) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for the workbench sentencepiece model.

    The model has no BOS/EOS/PAD (so none is added), no dummy prefix (so no prefix
    space, non-legacy handling of a leading space), and "<unk>" at id 0.
    """
    cfg = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "legacy": False,
        "bos_token": None,
        "eos_token": None,
        "pad_token": None,
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False,
        "model_max_length": seq_len,
        "sp_model_kwargs": {},
    }
    special = {"unk_token": "<unk>"}
    return {"tokenizer_config.json": cfg, "special_tokens_map.json": special}


# sentencepiece ModelProto.SentencePiece.Type
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_UNUSED, _SP_BYTE = 1, 2, 3, 4, 5, 6


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message; the value's type is the wire type's: an int
    (varint), a float (fixed 32 or 64 bits) or bytes (length-delimited)."""
    i = 0
    val: Any
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 1:
            val, i = struct.unpack_from("<d", buf, i)[0], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wt == 5:
            val, i = struct.unpack_from("<f", buf, i)[0], i + 4
        else:
            raise TokenizerFormatError(f"tokenizer.model is not a sentencepiece model (protobuf wire type {wt})")
        yield num, wt, val


def spm_pieces(model_proto: bytes) -> list[tuple[str, float, int]]:
    """(piece, score, type) of every piece of a sentencepiece model, in id order.

    Read straight from the protobuf wire format: sentencepiece's Python API does not say
    which pieces are user-defined, and its _pb2 module needs the protobuf package.
    """
    pieces = []
    try:
        for num, wt, val in _fields(model_proto):
            if num == 1 and wt == 2:
                piece, score, typ = "", 0.0, _SP_NORMAL
                for n2, w2, v2 in _fields(val):
                    if n2 == 1 and w2 == 2:
                        piece = v2.decode("utf-8")
                    elif n2 == 2 and w2 == 5:
                        score = v2
                    elif n2 == 3 and w2 == 0:
                        typ = v2
                pieces.append((piece, score, typ))
    except (IndexError, UnicodeDecodeError):
        raise TokenizerFormatError("tokenizer.model is not a valid sentencepiece model") from None
    return pieces


def bpe_merges(vocab: dict[str, int]) -> list[list[str]]:
    """Merges for a sentencepiece BPE vocabulary, ranked by the merged piece's id.

    sentencepiece merges the adjacent pair whose concatenation has the best score
    (BPE scores fall with the id), so a merge's rank is its result's id; ties (one
    result, several splits) by the parts' ids, then lengths — the order transformers'
    SentencePieceExtractor / generate_merges gives.
    """
    merges = []
    for merged, mid in vocab.items():
        local = []
        for k in range(1, len(merged)):
            left, right = merged[:k], merged[k:]
            if left in vocab and right in vocab:
                local.append((left, right, mid))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: (x[2], len(x[0]), len(x[1])))
    return [[a, b] for a, b, _ in merges]


def tokenizer_json(model_proto: bytes) -> dict:
    """tokenizer.json (Hugging Face `tokenizers`) equivalent to the workbench sentencepiece BPE model.

    No normalizer (identity), spaces become "▁" with no prefix added, BPE with byte
    fallback; control and user-defined pieces ("\n") are added tokens matched before
    BPE, as sentencepiece does. With it, AutoTokenizer needs neither sentencepiece nor
    protobuf, and no conversion heuristics decide the ids.
    """
    pieces = spm_pieces(model_proto)
    vocab = {p: i for i, (p, _s, _t) in enumerate(pieces)}
    unk = next((p for p, _s, t in pieces if t == _SP_UNKNOWN), None)
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in (_SP_CONTROL, _SP_UNKNOWN)}
             for i, (p, _s, t) in enumerate(pieces) if t in (_SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": bpe_merges(vocab)},
    }
