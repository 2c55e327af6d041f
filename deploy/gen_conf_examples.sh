#!/bin/sh
# Writes deploy/loomd.conf.example and deploy/loom-agent.conf.example from the
# binaries' own --help (common/config.h tables), so every option is listed with
# its type, default, range and help, and the files cannot drift from the code
# (tests/integration/ops_conf_examples.sh regenerates and compares them).
# Usage: deploy/gen_conf_examples.sh BIN_DIR [OUT_DIR (default: deploy/)]
set -eu
bin=${1:?usage: gen_conf_examples.sh BIN_DIR [OUT_DIR]}
out=${2:-$(dirname "$0")}

gen() { # prog install-path purpose
    prog=$1
    {
        echo "# $prog configuration: $3."
        echo "# Install as $2 (mode 0640, owner root:loom); the systemd unit passes"
        echo "# --config $2. Generated from \`$prog --help\` by deploy/gen_conf_examples.sh."
        echo "#"
        echo "# Format: 'name = value' lines; '#' starts a comment. Every setting can also be"
        echo "# given as a flag (--name value) or an environment variable (LOOM_NAME, upper"
        echo "# case, '-' as '_'); precedence: default < this file < environment < flag."
        echo "# Each setting is shown commented out at its default: uncomment to change it."
        "$bin/$prog" --help | awk '
            /^  --/ {
                name = substr($1, 3); type = $2; def = ""; range = "";
                # "default X [lo..hi]": X may be empty or "(none)"
                line = $0; sub(/^.*default /, "", line);
                if (match(line, / \[[^]]*\]$/)) { range = substr(line, RSTART + 1); line = substr(line, 1, RSTART - 1) }
                def = line; next
            }
            /^      / {
                if (name == "" || name == "config") { name = ""; next }
                help = $0; sub(/^ +/, "", help);
                print "";
                print "# " help;
                printf "# type %s%s%s\n", type, (range != "" ? ", range " range : ""),
                       (def == "(none)" ? ", no default" : "");
                printf "#%s =%s\n", name, (def == "(none)" || def == "" ? "" : " " def);
                name = ""
            }'
    } > "$out/$prog.conf.example.tmp"
    mv "$out/$prog.conf.example.tmp" "$out/$prog.conf.example"
}

gen loomd /etc/loom/loomd.conf "the coordinator (one per cluster)"
gen loom-agent /etc/loom/agent.conf "the node agent (one per GPU node)"
