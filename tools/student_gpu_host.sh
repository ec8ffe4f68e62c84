#!/usr/bin/env bash
# The student's SFT, its evaluation and its RL rounds on a GPU host without network (docs/student.md, sections 4
# and 6).
#
#   bash tools/student_gpu_host.sh STAGE...      stages: prepare sft bench eval dagger label stop rl   (from the project's root)
#
#   prepare  copies the project to $WORK/proj (later calls may replace the working tree), puts the carried student back
#            together ($CARRY, tools/carry.py), installs its wheels (gguf, and the locked transformers and tokenizers),
#            builds the bf16 folder (captain_ros_training student build), and, where it was carried, puts together and
#            installs the rollout bundle (tools/host_bundle.py: carried into $BUNDLE_CARRY, unpacked into $BUNDLE, its
#            install.sh run; only the eval stage needs it)
#   sft      LoRA SFT in the background (setsid: it outlives this call) on the examples built beforehand by
#            `captain_ros_training rl sft-data --max-tokens 24576` ($SFT_EXAMPLES: by default $EXAMPLES, carried with
#            the student; the label stage's file for a DAgger SFT) or else on the expert store ($STORE); waits for it up
#            to $WAIT_S seconds; once done, packs the adapter and the run record into $OUT/adapter (files of at most
#            15 MiB) to bring back
#   bench    bench/serve.py on the student: the server's tokens/s with 32 queued 4k-token requests, varlen vs sdpa
#            attention (about a minute); its result file into $OUT/bench
#   eval     the fine-tuned student's evaluation (captain_ros_training.student_eval, the transformers server on the GPU,
#            the twin, harness and sandbox on the host's cores) in the background; waits up to $WAIT_S seconds; packs
#            its episode stores (gzip) into $OUT/eval once done, else what is recorded so far into $OUT/eval_partial
#            (copied back into $WORK/sft_eval/ on a fresh host, the evaluation resumes from it). It serves this host's
#            SFT (its marker rows fitted by captain_ros_training.token_rows on $EXAMPLES unless the SFT trained them),
#            or else $FINE_TUNED (its adapter/, by default the one kept in models/, and a token_rows.npz if it has one)
#            merged into the student in $WORK/fine_tuned (never in $WORK/sft, where this host's SFT goes)
#   dagger   the same served student's own episodes on training starts ($DAGGER_STARTS per task, seed $DAGGER_SEED;
#            captain_ros_training student-eval run --split train) in the background, for captain_ros_training.dagger to
#            label with the expert's next cell; its stores stay in $WORK/dagger (too large to bring back)
#   label    captain_ros_training.dagger's labels of those stores as they are now, added to $EXAMPLES
#            (`captain_ros_training rl sft-data --examples $EXAMPLES --dagger ...`): the next SFT's data file, in
#            $OUT/dagger_data and $WORK/dagger_data (SFT_EXAMPLES=$WORK/dagger_data/sft_data_dagger.pkl.xz trains on it)
#   stop     ends the background dagger, eval and rl runs (their servers and workers with them) and waits until they
#            are gone, e.g. `label stop sft eval`: the SFT then has the GPU to itself
#   rl       RL rounds on the served student (captain_ros_training rl-host run, in the background): hf_serve
#            --weight-reload serves it, its rollouts on training starts run on the host's cores, LoRA rounds train
#            and sync into the running server, a checkpoint after each round in $WORK/rl/checkpoints. It resumes from
#            $WORK/rl's own checkpoint, or else from one carried in ($RL_CARRY: the files an earlier call brought
#            back). Waits up to $WAIT_S seconds, then packs the latest checkpoint into $OUT/rl (flat files of 15 MiB,
#            tools/carry.py) each time; done when $RL_ROUNDS rounds are (0: never, the session's end stops it)
#
# Every stage is idempotent: rerun the same command to keep waiting, or after a lost call. WAIT_S bounds the whole
# call, not each stage: `sft eval` waits for the SFT, starts the evaluation the moment it ends, and waits for that
# with what is left. What a stage starts logs to $WORK/<stage>.log. Variables (defaults): CARRY (/tmp/carry),
# BUNDLE_CARRY (/tmp/carry_hb), BUNDLE (/tmp/hb/host_bundle), STORE (.cache/store/rollout.sqlite), WORK (/tmp/work),
# OUT (./back), WAIT_S (500), WORKERS (33), EPOCHS (3), RANK (32), RECOVERY (0; recovery examples per episode, as the
# examples were built with `sft-data --recovery-per-episode`), GRAPHS (0; 1: the eval's server decodes from CUDA
# graphs), KV_SHARE (0.8: the share of free GPU memory a server's KV cache takes; 0.4 to run eval and dagger
# together: started at once, each sees the whole GPU free, and together they ran out of memory), DAGGER_STARTS (8),
# DAGGER_SEED (1), FINE_TUNED (models/qwen2.5-coder-0.5b-captain-sft), EXAMPLES ($WORK/carried/sft_data.pkl.xz),
# SFT_EXAMPLES ($EXAMPLES),
# RL_CARRY (/tmp/carry_rl), RL_ROUNDS (0), RL_KV_SHARE (0.5: the trainer shares the GPU with the server), RL_ARGS
# (more `rl-host run` options, e.g. "--groups-per-round-n 8 --learning-rate 4e-5"; the settings a run resumes with
# must be the ones it began with).
set -u -o pipefail

CARRY=${CARRY:-/tmp/carry}
BUNDLE_CARRY=${BUNDLE_CARRY:-/tmp/carry_hb}
BUNDLE=${BUNDLE:-/tmp/hb/host_bundle}
STORE=${STORE:-.cache/store/rollout.sqlite}
WORK=${WORK:-/tmp/work}
OUT=${OUT:-./back}
WAIT_S=${WAIT_S:-500}
WAIT_UNTIL=$(($(date +%s) + WAIT_S))
WORKERS=${WORKERS:-33}
EPOCHS=${EPOCHS:-3}
RANK=${RANK:-32}
RECOVERY=${RECOVERY:-0}
GRAPHS=${GRAPHS:-0}
KV_SHARE=${KV_SHARE:-0.8}
FINE_TUNED=${FINE_TUNED:-models/qwen2.5-coder-0.5b-captain-sft}
DAGGER_STARTS=${DAGGER_STARTS:-8}
DAGGER_SEED=${DAGGER_SEED:-1}
EXAMPLES=${EXAMPLES:-$WORK/carried/sft_data.pkl.xz}
SFT_EXAMPLES=${SFT_EXAMPLES:-$EXAMPLES}
RL_CARRY=${RL_CARRY:-/tmp/carry_rl}
RL_ROUNDS=${RL_ROUNDS:-0}
RL_KV_SHARE=${RL_KV_SHARE:-0.5}
RL_ARGS=${RL_ARGS:-}
NAME=qwen2.5-coder-0.5b-instruct
STUDENT=$WORK/student/$NAME
PROJ=$WORK/proj
[ $# -gt 0 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2; }
mkdir -p "$WORK" "$OUT"
export PYTHONPATH=$PROJ/src/captain_ros:/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
[ -f "$WORK/host.env" ] && . "$WORK/host.env"

say() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "$STAGE" "$*"; }

# start CMD... in the background under setsid unless $1 (a pattern) runs already or $2 (a file) exists
background() {
    local pattern=$1 done_file=$2 log=$3
    shift 3
    if [ -e "$done_file" ]; then return 0; fi
    if pgrep -f "$pattern" >/dev/null; then say "running already: $pattern"; return 0; fi
    say "starting: $*"
    setsid nohup "$@" >"$log" 2>&1 </dev/null &
}

# wait until WAIT_S after the call began for $1 (a file) while $2 (a pattern) runs; 0 when the file is there
wait_for() {
    local done_file=$1 pattern=$2
    while [ "$(date +%s)" -lt "$WAIT_UNTIL" ]; do
        [ -e "$done_file" ] && return 0
        pgrep -f "$pattern" >/dev/null || { [ -e "$done_file" ]; return; }
        sleep 1
    done
    [ -e "$done_file" ]
}

prepare() {
    if [ ! -d "$PROJ/src" ]; then mkdir -p "$PROJ" && cp -r src tools "$PROJ"/; fi
    # the bundle first: its transformers (the locked version) converts the student's tokenizer. The host's own (5.17)
    # writes "<tool_call>" as four ordinary tokens, and a student trained on that is lost behind any other server
    if [ ! -f "$BUNDLE/install.sh" ] && [ -d "$BUNDLE_CARRY" ]; then
        python3 "$PROJ/tools/carry.py" unpack "$BUNDLE_CARRY" --to "$(dirname "$BUNDLE")" -q || return 1
    fi
    if [ -f "$BUNDLE/install.sh" ] && [ ! -f "$WORK/host.env" ]; then
        REPO=$PROJ bash "$BUNDLE/install.sh" >"$WORK/host.env.tmp" || return 1
        mv "$WORK/host.env.tmp" "$WORK/host.env"
        . "$WORK/host.env"
        say "rollout bundle installed: $(wc -l <"$WORK/host.env") settings in $WORK/host.env"
    fi
    # without the bundle the SFT still runs: the student's carry holds the locked transformers (and tokenizers)
    # wheels beside gguf, so the tokenizer is converted as here; only the eval stage needs the bundle
    [ -f "$WORK/host.env" ] || say "no rollout bundle (carry its parts into $BUNDLE_CARRY for the eval stage)"
    if [ ! -f "$STUDENT/captain_student.json" ]; then
        python3 "$PROJ/tools/carry.py" unpack "$CARRY" --to "$WORK/carried" -q || return 1
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WORK"/carried/wheels/*.whl ||
            return 1
        mkdir -p "$WORK/student" && cp "$WORK/carried/$NAME.gguf" "$WORK/student/"
        python3 -m captain_ros_training student build --cache "$WORK/student" || return 1  # checks the chat markers' tokens
    fi
    python3 -m captain_ros_training student check "$STUDENT" || return 1
    say "student folder: $STUDENT (transformers $(python3 -c 'import transformers; print(transformers.__version__)'))"
}

sft() {
    local data
    if [ -f "$SFT_EXAMPLES" ]; then  # built beforehand by `captain_ros_training rl sft-data` (the same options as below)
        data=(--examples "$SFT_EXAMPLES")
    else
        [ -f "$STORE" ] && cp -n "$STORE" "$WORK/expert.sqlite"
        data=(--store "$WORK/expert.sqlite")
    fi
    background "captain_ros_training rl sft" "$WORK/sft/sft_run.json" "$WORK/sft.log" \
        python3 -m captain_ros_training rl sft --model "$STUDENT" "${data[@]}" --out "$WORK/sft" \
        --lora-rank "$RANK" --epochs "$EPOCHS" --lr 2e-4 --warmup 5 --lr-schedule cosine --rows 1 --grad-accum 8 \
        --max-tokens 24576 --recovery-per-episode "$RECOVERY" --gradient-checkpointing --no-progress
    if wait_for "$WORK/sft/sft_run.json" "captain_ros_training rl sft"; then
        say "SFT done: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r['episodes']} episodes, {r['steps']} steps, {r['tokens_per_s']:.0f} tokens/s, loss {r['final_loss']:.3f}\")" "$WORK/sft/sft_run.json")"
        [ -f "$OUT/adapter/adapter.carry-manifest.json" ] ||
            python3 "$PROJ/tools/carry.py" pack "$WORK/sft/adapter" "$WORK/sft/sft_run.json" "$WORK/sft/sft_metrics.jsonl" \
                --out "$OUT/adapter" --max-mib 15 --flat --name adapter -q
    else
        say "SFT not done yet:"
        tail -c 2000 "$WORK/sft.log"
        return 3
    fi
}

# the student that the eval, dagger and rl stages serve: this host's SFT ($WORK/sft/model) once it is done, else
# $FINE_TUNED merged into the student ($WORK/fine_tuned/model, apart, so that an SFT after it starts from nothing);
# its folder in $SERVED
served_model() {
    [ -f "$WORK/host.env" ] || { say "no rollout bundle installed: carry its parts into $BUNDLE_CARRY, run prepare"; return 1; }
    # the served student: the adapter merged and the untrained marker rows fitted (captain_ros_training.token_rows;
    # LoRA cannot reach them, and without them no reply is a tool call)
    if [ -f "$WORK/sft/sft_run.json" ] && [ -f "$WORK/sft/model/config.json" ] && [ ! -f "$WORK/sft/model/token_rows.npz" ] &&
        ! python3 -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1])).get("trained_rows"))' \
            "$WORK/sft/sft_run.json" 2>/dev/null; then  # the SFT did not train the marker rows itself
        say "this host's SFT: fitting its marker rows (python -m captain_ros_training token-rows fit)"
        python3 -m captain_ros_training token-rows fit --model "$WORK/sft/model" --examples "$SFT_EXAMPLES" --out "$WORK/sft/fitted" \
            --prefix-tokens 5400 && rm -rf "$WORK/sft/model" && mv "$WORK/sft/fitted" "$WORK/sft/model" || return 1
    fi
    SERVED=$WORK/sft/model
    [ -f "$WORK/sft/sft_run.json" ] && [ -f "$SERVED/config.json" ] && return 0
    SERVED=$WORK/fine_tuned/model
    if [ ! -f "$SERVED/config.json" ]; then
        [ -f "$FINE_TUNED/adapter/adapter_config.json" ] || { say "no fine-tuned student: run the sft stage, or set FINE_TUNED to a folder with adapter/"; return 1; }
        say "merging $FINE_TUNED/adapter into the student"
        rm -rf "$WORK/fine_tuned" && mkdir -p "$WORK/fine_tuned"
        python3 -m captain_ros_training student merge "$FINE_TUNED/adapter" --base "$STUDENT" --out "$WORK/fine_tuned/merged" || return 1
        if [ -f "$FINE_TUNED/token_rows.npz" ]; then  # rows fitted after an SFT that did not train them
            python3 -m captain_ros_training token-rows apply --model "$WORK/fine_tuned/merged" --rows "$FINE_TUNED/token_rows.npz" \
                --out "$SERVED" && rm -rf "$WORK/fine_tuned/merged" || return 1
        else
            mv "$WORK/fine_tuned/merged" "$SERVED"
        fi
    fi
}

# end this $WORK's background runs that serve a student (dagger, eval, rl: their servers and workers go with them)
stop_stage() {
    local pattern="[c]aptain_ros_training (student-eval run|rl-host run|hf-serve) .*$WORK/" waited=0
    pgrep -f "$pattern" >/dev/null || { say "nothing to stop"; return 0; }
    pkill -TERM -f "$pattern"
    while pgrep -f "$pattern" >/dev/null && [ $waited -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
    pgrep -f "$pattern" >/dev/null && { pkill -KILL -f "$pattern"; sleep 2; }
    say "stopped the background runs (${waited} s)"
}

eval_stage() {
    served_model || return 1
    background "captain_ros_training student-eval run.*sft_eval" "$WORK/sft_eval/done" "$WORK/eval.log" \
        bash -c "python3 -m captain_ros_training student-eval run --model '$SERVED' --label student-sft \
            --out '$WORK/sft_eval' --server transformers --workers $WORKERS $([ "$GRAPHS" = 1 ] && echo --cuda-graphs) --kv-cache-memory-fraction $KV_SHARE --no-progress && touch '$WORK/sft_eval/done'"
    if wait_for "$WORK/sft_eval/done" "captain_ros_training student-eval run.*sft_eval"; then
        say "evaluation done"
        [ -f "$OUT/eval/eval.carry-manifest.json" ] || pack_stores eval sft_eval
    else
        say "evaluation not done yet:"
        tail -c 2000 "$WORK/eval.log" | tr '\r' '\n' | tail -5
        grep -h "tokens/s\|varlen attention\|slot engine" "$WORK"/sft_eval/*/logs/server.log 2>/dev/null | tail -3
        pack_stores eval_partial sft_eval  # what is recorded so far, in case the machine goes: the evaluation resumes from it
        return 3
    fi
}

# the served student's own episodes on $DAGGER_STARTS training starts per task (seed $DAGGER_SEED), for
# captain_ros_training.dagger to label with the expert's next cell; never an evaluation
dagger_stage() {
    served_model || return 1
    background "captain_ros_training student-eval run.*dagger" "$WORK/dagger/done" "$WORK/dagger.log" \
        bash -c "python3 -m captain_ros_training student-eval run --model '$SERVED' --label student-sft-train \
            --out '$WORK/dagger' --split train --starts-per-task $DAGGER_STARTS --seed $DAGGER_SEED \
            --server transformers --workers $WORKERS $([ "$GRAPHS" = 1 ] && echo --cuda-graphs) --kv-cache-memory-fraction $KV_SHARE --no-progress && \
            touch '$WORK/dagger/done'"
    # the stores stay here (104 episodes are about 90 MB, past what a call brings back, and $OUT's files over its
    # limits could keep the others from coming back too): the label stage brings back what training needs
    if wait_for "$WORK/dagger/done" "captain_ros_training student-eval run.*dagger"; then
        say "training-start rollouts done: label them (the label stage)"
    else
        say "training-start rollouts not done yet (the label stage labels what they recorded so far):"
        tail -c 2000 "$WORK/dagger.log" | tr '\r' '\n' | tail -5
        return 3
    fi
}

# DAgger labels of the dagger stage's stores as they are now (captain_ros_training.dagger, through `sft-data --dagger`)
# added to $EXAMPLES: one data file for the next SFT, in $OUT/dagger_data (the stores themselves may be too large to
# bring back)
label_stage() {
    local copies=$WORK/label
    rm -rf "$copies" && mkdir -p "$copies" "$OUT/dagger_data"
    python3 - "$WORK/dagger" "$copies" <<'PY' || return 1
import sqlite3, sys
from pathlib import Path
for store in sorted(Path(sys.argv[1]).glob("*/rollout.sqlite")):  # sqlite's online backup: consistent while written
    with sqlite3.connect(store) as a, sqlite3.connect(Path(sys.argv[2]) / f"{store.parent.name}.sqlite") as b:
        a.backup(b)
PY
    ls "$copies"/*.sqlite >/dev/null 2>&1 || { say "no training-start rollouts to label: run the dagger stage"; return 1; }
    local stores=()
    for s in "$copies"/*.sqlite; do stores+=(--dagger "$s"); done
    python3 -m captain_ros_training rl sft-data --model "$STUDENT" --examples "$EXAMPLES" --max-tokens 24576 \
        --recovery-per-episode "$RECOVERY" "${stores[@]}" --out "$WORK/dagger_data/sft_data_dagger.pkl.xz" || return 1
    cp "$WORK/dagger_data/sft_data_dagger.pkl.xz" "$OUT/dagger_data/"
}

# RL rounds on the served student (captain_ros_training rl-host run): resumes from $WORK/rl's own checkpoint or one
# carried in ($RL_CARRY), packs the latest checkpoint into $OUT/rl each call (a host's files vanish with it)
rl_stage() {
    served_model || return 1
    local resume=() status=0
    if ls "$RL_CARRY"/*.carry-manifest.json >/dev/null 2>&1; then  # files an earlier host's call brought back
        python3 "$PROJ/tools/carry.py" unpack "$RL_CARRY" --to "$WORK/rl_carried" -q || return 1  # rerun-safe
        resume=(--resume-from "$WORK/rl_carried")
    fi
    # shellcheck disable=SC2086  # RL_ARGS: options split as words
    background "captain_ros_training rl-host run" "$WORK/rl/done" "$WORK/rl.log" \
        python3 -m captain_ros_training rl-host run --model "$SERVED" --out "$WORK/rl" --resume "${resume[@]}" \
        --workers-n "$WORKERS" --rounds-n "$RL_ROUNDS" --kv-cache-memory-fraction "$RL_KV_SHARE" \
        $([ "$GRAPHS" = 1 ] && echo --cuda-graphs) $RL_ARGS
    if wait_for "$WORK/rl/done" "captain_ros_training rl-host run"; then
        say "RL rounds done: $(cat "$WORK/rl/done")"
    else
        say "RL rounds go on (rerun to keep waiting):"
        status=3
    fi
    grep -h "rl-host\|Error\|error" "$WORK/rl.log" 2>/dev/null | tail -6
    local latest="" try
    for try in 1 2 3; do  # a copy first: the driver removes a checkpoint once the next one is whole
        latest=$(cat "$WORK/rl/checkpoints/LATEST" 2>/dev/null) || { latest=""; break; }
        rm -rf "$WORK/rl_pack" && mkdir -p "$WORK/rl_pack" &&
            cp -r "$WORK/rl/checkpoints/$latest" "$WORK/rl_pack/" 2>/dev/null && break  # unpacks as round-NNNNN/
        say "checkpoint $latest was replaced while copied (try $try)"
        latest=""
    done
    if [ -n "$latest" ]; then
        rm -rf "${OUT:?}/rl"
        python3 "$PROJ/tools/carry.py" pack "$WORK/rl_pack/$latest" --out "$OUT/rl" --max-mib 15 --flat --name rl -q ||
            return 1
        say "checkpoint $latest packed into $OUT/rl (carry its files into $RL_CARRY on the next host to resume)"
    else
        say "no checkpoint yet (the critic's warm start comes first)"
    fi
    return $status
}

# the stores of $WORK/$2 as they are now (sqlite's online backup: consistent while episodes are being written),
# gzipped, with each run's summary, packed into $OUT/$1
pack_stores() {
    local stage=$WORK/back/$2  # unpacked here with --to runs/student: runs/student/$2/<run>/
    rm -rf "$WORK/back" "${OUT:?}/$1" && mkdir -p "$stage"
    python3 - "$WORK/$2" "$stage" <<'PY' || return 1
import gzip, shutil, sqlite3, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for store in sorted(src.glob("*/rollout.sqlite")):
    out = dst / store.parent.name
    out.mkdir(parents=True)
    with sqlite3.connect(store) as a, sqlite3.connect(out / "rollout.sqlite") as b:
        a.backup(b)
    with open(out / "rollout.sqlite", "rb") as f, gzip.open(out / "rollout.sqlite.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    (out / "rollout.sqlite").unlink()
    for name in ("run.json", "summary.json"):  # where it ran (from its start), and its summary once done
        if (store.parent / name).is_file():
            shutil.copy(store.parent / name, out)
PY
    python3 "$PROJ/tools/carry.py" pack "$stage" --out "$OUT/$1" --max-mib 15 --flat --name "$1" -q
}

for STAGE in "$@"; do
    case $STAGE in
    prepare) prepare || exit 1 ;;
    sft) sft || exit $? ;;
    bench)
        rm -f bench/results/serve.json # the checkout's (another machine's): a failed run must bring back nothing
        python3 bench/serve.py --model "$STUDENT" --requests 32 --prompt-tokens 4096 --new-tokens 256 \
            >"$WORK/bench.log" 2>&1 || { tail -c 2000 "$WORK/bench.log"; exit 1; }
        grep -v "Loading weights" "$WORK/bench.log" | tail -12
        mkdir -p "$OUT/bench" && cp bench/results/serve.json "$OUT/bench/" || exit 1
        ;;
    eval) eval_stage || exit $? ;;
    dagger) dagger_stage || exit $? ;;
    label) label_stage || exit $? ;;
    stop) stop_stage || exit $? ;;
    rl) rl_stage || exit $? ;;
    *) echo "unknown stage $STAGE (prepare, sft, bench, eval, dagger, label, stop, rl)" >&2; exit 2 ;;
    esac
done
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
ls -la "$OUT"/* 2>/dev/null
exit 0  # every stage asked for is done (a stage that is not exits above); an empty $OUT is no failure
