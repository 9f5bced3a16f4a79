# Sourced by the launchers beside it. run_recipe PRESET SERVER [OVERRIDES...] runs the trainer on the Hydra preset
# verl_omni/trainer/config/experiment/PRESET.yaml (every recipe value, each number's source beside it) with the paths
# and sizes of the environment, then the overrides (Hydra: last wins).
#
# SERVER names the environment variables of the reward's VLM server, <SERVER>_URL (its API base, default
# http://127.0.0.1:8000/v1) and <SERVER>_MODEL (the name it serves, default Qwen/Qwen2.5-VL-7B-Instruct): OCR for the
# OCR scorer, JUDGE for the VLM judge; they set reward.diffusion.scorers.0.params.url and .model.
# The other variables become their keys only when set, so the preset's value stands otherwise:
#   MODEL_PATH  actor_rollout_ref.model.path
#   DATA_DIR    data.train_files=$DATA_DIR/train.parquet, data.val_files=$DATA_DIR/val.parquet
#   NGPUS       trainer.n_gpus_per_node (GPU presets: the colocated rollout follows it)
#   NNODES      trainer.nnodes (GPU presets: the colocated rollout follows it)
#   OUT         trainer.default_local_dir (unset: outputs/flowgrpo/<experiment name>)

run_recipe() {
    local preset=$1 url_var=$2_URL model_var=$2_MODEL
    shift 2
    local keys=(
        "reward.diffusion.scorers.0.params.url=${!url_var:-http://127.0.0.1:8000/v1}"
        "reward.diffusion.scorers.0.params.model=${!model_var:-Qwen/Qwen2.5-VL-7B-Instruct}"
    )
    if [ -n "${MODEL_PATH:-}" ]; then
        keys+=("actor_rollout_ref.model.path=$MODEL_PATH")
    fi
    if [ -n "${DATA_DIR:-}" ]; then
        keys+=("data.train_files=$DATA_DIR/train.parquet" "data.val_files=$DATA_DIR/val.parquet")
    fi
    if [ -n "${NGPUS:-}" ]; then
        keys+=("trainer.n_gpus_per_node=$NGPUS")
    fi
    if [ -n "${NNODES:-}" ]; then
        keys+=("trainer.nnodes=$NNODES")
    fi
    if [ -n "${OUT:-}" ]; then
        keys+=("trainer.default_local_dir=$OUT")
    fi
    exec python3 -m verl_omni.trainer.main_flowgrpo "+experiment=$preset" "${keys[@]}" "$@"
}
