"""Reference for `loom-data chat --template mistral`: Mistral v0.1/v0.2 instruct conversations
built the way mistral-common's SentencePiece (v1) tokenizer builds them, with Debian's
python3-sentencepiece: BOS, then for each user turn encode("[INST] " + content + " [/INST]")
(the system prompt, if any, before the last user message with a blank line), for each assistant
turn encode(content) + EOS, masked.
    python3 chat_mistral_ref.py MODEL CASES.jsonl"""
import json
import sys

import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
for line in open(sys.argv[2], encoding="utf-8"):
    msgs = json.loads(line)["messages"]
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
    msgs = msgs[1:] if system is not None else msgs
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    ids, mask = [sp.bos_id()], [0]
    for i, m in enumerate(msgs):
        if m["role"] == "user":
            content = m["content"]
            if system is not None and i == last_user:
                content = system + "\n\n" + content
            piece = sp.encode("[INST] " + content + " [/INST]")
            ids += piece
            mask += [0] * len(piece)
        else:
            piece = sp.encode(m["content"]) + [sp.eos_id()]
            ids += piece
            mask += [1] * len(piece)
    print(json.dumps({"ids": ids, "mask": mask}, separators=(",", ":")))
