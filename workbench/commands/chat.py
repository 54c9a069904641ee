"""`workbench chat`: talk with a chat-tuned run's checkpoint through the template it was trained with.

Interactive (a prompt per turn; /reset starts over, an empty line or end of input ends it), or one reply for
scripts with ``--message``, or a server with ``--serve``: the model loaded once, then one JSON request a line on
stdin, its reply a line on stdout (the TUI's chat keeps one per column, so a turn does not reload the model).
Greedy by default, so the same checkpoint answers the same conversation the same way (as the exported model does in
llama.cpp or transformers with greedy decoding)."""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from workbench import rundir
from workbench.commands.common import add_json_option, add_run_argument, add_sampling_options, sampling_of
from workbench.data.chat.chat_templates import ChatTemplate, ChatTemplateError, run_template
from workbench.data.text.tokenizer import AnyTokenizer, load_tokenizer
from workbench.machine.detect import Machine
from workbench.plan.sampling import CHAT, Sampling, SamplingError
from workbench.plan.settings import resolve_device

if TYPE_CHECKING:  # (torch: the model is loaded inside the command)
    from workbench.train.model import GPT


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="chat with a run trained on conversations (data.format = chat)")
    add_run_argument(p, checkpoint=True)
    p.add_argument("--system", default="", help="a system message put first")
    p.add_argument("--message", default=None, help="one user message: print the reply and exit (for scripts)")
    p.add_argument("--conversation", default=None, metavar="FILE",
                   help="a conversation so far, as JSON ({\"messages\": [...]} or the list; - reads stdin), "
                        "ending with a user message: print the next reply and exit (the TUI's chat uses this)")
    add_sampling_options(p, CHAT)
    add_json_option(p, "with --message: the reply, its token ids and whether it ended with the end-of-turn token, "
                       "as JSON")
    p.add_argument("--serve", action="store_true",
                   help="load the model once, then answer JSON requests, one a line on stdin, each with one JSON "
                        "reply line on stdout (see docs/reference/chat.md; the TUI's chat uses this)")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="with --serve: exit after this long without a request (default: never; end of input "
                        "always ends it)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto")
    p.set_defaults(func=run)


def read_conversation(path: str) -> list[dict]:
    """--conversation: the messages so far, each a role and a content, the last one the user's."""
    where = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        obj = json.loads(text)
    except OSError as e:
        raise rundir.RunError(f"cannot read --conversation {where}: {e.strerror or e}") from None
    except ValueError as e:
        raise rundir.RunError(f"--conversation {where} is not JSON ({e})") from None
    msgs = obj.get("messages") if isinstance(obj, dict) else obj
    if not (isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str) for m in msgs)) or msgs[-1]["role"] != "user":
        raise rundir.RunError(f"--conversation {where} must be a list of messages (or {{\"messages\": [...]}}), each "
                              "{\"role\": system|user|assistant, \"content\": text}, the last one the user's")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def run(args: argparse.Namespace) -> int:
    run_dir = rundir.resolve_run(args.runs_dir, args.run)
    ckpt = rundir.select_checkpoint(run_dir, args.checkpoint)
    sampling = sampling_of(args)
    if args.json and args.message is None and args.conversation is None:
        raise rundir.RunError("--json needs --message or --conversation (one reply)")
    if args.serve and (args.message is not None or args.conversation is not None or args.json):
        raise rundir.RunError("--serve reads its requests on stdin: leave out --message, --conversation and --json")
    if args.idle_exit is not None and (not args.serve or args.idle_exit <= 0):
        raise rundir.RunError("--idle-exit takes a number of seconds > 0, with --serve")
    given = read_conversation(args.conversation) if args.conversation is not None else None
    try:
        template = run_template(run_dir)
    except ChatTemplateError as e:
        raise rundir.RunError(str(e)) from None
    t0 = time.time()
    # lazily: torch and the engine load only once the arguments are known to be good
    import torch

    from workbench.machine.probe import this_machine
    from workbench.train.chat_reply import reply
    from workbench.train.checkpoint import load_run_model

    tok = load_tokenizer(run_dir)
    device = resolve_device(args.device, Machine() if args.device == "cpu" else this_machine())
    model = load_run_model(run_dir, ckpt["step"], device).model
    if device == "cpu" and model.num_params() < 50e6:
        torch.set_num_threads(1)  # one token at a time: one thread is faster (see `workbench sample`)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    kw = dict(max_tokens=sampling.max_new_tokens, **sampling.generate_args())

    def emit(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if args.serve:
        print(json.dumps({"ready": True, "run": run_dir.name, "checkpoint": ckpt["name"], "step": ckpt["step"],
                          "pid": os.getpid(), "load_seconds": round(time.time() - t0, 3)}), flush=True)
        serve(model, tok, template, messages, sampling, ckpt["name"], args.idle_exit)
        return 0
    if args.message is not None or given is not None:
        turns = messages + (given if given is not None else [{"role": "user", "content": args.message}])
        if args.json:
            r = reply(model, tok, template, turns, **kw)
            print(json.dumps({"reply": r.text, "ids": r.ids, "stopped": r.stopped, "checkpoint": ckpt["name"]}))
        else:
            r = reply(model, tok, template, turns, on_text=emit, **kw)
            sys.stdout.write("\n")
            if not r.stopped:  # (stdout is the reply alone, for scripts; a blank or cut one is said here)
                print(f"note: no end-of-turn token: the reply was cut at --max-new-tokens {sampling.max_new_tokens} "
                      "(a model that has not learned to end its turn yet goes on until then)", file=sys.stderr)
        return 0
    print(f"[{run_dir.name} {ckpt['name']}, loaded in {time.time() - t0:.2f} s; template {template.source}; "
          "/reset starts over, an empty line ends]", file=sys.stderr, flush=True)
    history = list(messages)
    while True:
        try:
            text = input("you> ")
        except EOFError:
            break
        if not text.strip():
            break
        if text.strip() == "/reset":
            history = list(messages)
            continue
        history.append({"role": "user", "content": text})
        sys.stdout.write("model> ")
        r = reply(model, tok, template, history, on_text=emit, **kw)
        sys.stdout.write("\n" if r.stopped else " [no end-of-turn: --max-new-tokens reached]\n")
        history.append({"role": "assistant", "content": r.text})
    return 0


# ---------------------------------------------------------------------------------------------------- --serve
#
# One request a line on stdin, a JSON object:
#   {"messages": [...], "system": "...", "id": ..., "stream": false,
#    "max_new_tokens": N, "temperature": T, "top_k": K, "top_p": P, "seed": S}
# "messages" as --conversation takes them (the last the user's); the rest optional: "system" put first (else the
# --system given), a sampling key replaces the option's value for this request only, "id" is echoed back. The
# reply is one line: {"id", "reply", "ids", "stopped", "checkpoint", "seconds"} (--message --json's keys, plus the
# seconds it took); with "stream": true, {"id", "text": piece} lines come before it as the reply is generated. A bad
# request gets {"id", "error": "..."} and the server reads on. End of input, or --idle-exit seconds without a
# request, ends it (exit 0).

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")


def request_lines(fd: int, idle_exit: float | None) -> Iterator[str]:
    """The lines on ``fd`` until its end, or until ``idle_exit`` seconds pass with no line."""
    buf = b""
    while True:
        while b"\n" not in buf:
            if idle_exit is not None and not select.select([fd], [], [], idle_exit)[0]:
                return
            data = os.read(fd, 65536)
            if not data:
                if buf.strip():
                    yield buf.decode("utf-8", "replace")
                return
            buf += data
        line, buf = buf.split(b"\n", 1)
        yield line.decode("utf-8", "replace")


def parse_request(line: str, sampling: Sampling, system: list[dict]) -> tuple[list[dict], Sampling, bool]:
    """(the messages to answer, the settings for them, whether to stream): ValueError says what is wrong."""
    try:
        req = json.loads(line)
    except ValueError as e:
        raise ValueError(f"a request is one JSON object a line ({e})") from None
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object: {\"messages\": [...]}")
    unknown = set(req) - {"messages", "system", "id", "stream", *SAMPLING_KEYS}
    if unknown:
        raise ValueError(f"unknown request key(s): {', '.join(sorted(unknown))}")
    msgs = req.get("messages")
    if not (isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str) for m in msgs)) or msgs[-1]["role"] != "user":
        raise ValueError("\"messages\" must be a list of {\"role\": system|user|assistant, \"content\": text}, "
                         "the last one the user's")
    if "system" in req and not isinstance(req["system"], str):
        raise ValueError("\"system\" must be text")
    first = ([{"role": "system", "content": req["system"]}] if req.get("system") else []) if "system" in req \
        else system
    try:
        chosen = sampling.replace(**{k: req[k] for k in SAMPLING_KEYS if k in req}).check()
    except (TypeError, SamplingError) as e:
        raise ValueError(str(e)) from None
    turns = first + [{"role": m["role"], "content": m["content"]} for m in msgs]
    return turns, chosen, bool(req.get("stream", False))


def serve(model: GPT, tok: AnyTokenizer, template: ChatTemplate, system: list[dict], sampling: Sampling,
          checkpoint: str, idle_exit: float | None) -> None:
    """Answer requests (see above) with the model loaded once, until the end of input or ``idle_exit``."""
    from workbench.train.chat_reply import reply

    def send(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in request_lines(sys.stdin.fileno(), idle_exit):
        if not line.strip():
            continue
        rid = None
        try:
            rid = json.loads(line).get("id")
        except (ValueError, AttributeError):
            pass
        try:
            turns, chosen, stream = parse_request(line, sampling, system)
        except ValueError as e:
            send({"id": rid, "error": str(e)})
            continue
        t0 = time.time()
        try:
            r = reply(model, tok, template, turns, max_tokens=chosen.max_new_tokens, **chosen.generate_args(),
                      on_text=(lambda piece: send({"id": rid, "text": piece})) if stream else None)
        except Exception as e:  # (the conversation's fault or the engine's: said, and the server answers the next)
            send({"id": rid, "error": f"{type(e).__name__}: {e}"})
            continue
        send({"id": rid, "reply": r.text, "ids": r.ids, "stopped": r.stopped, "checkpoint": checkpoint,
              "seconds": round(time.time() - t0, 4)})
