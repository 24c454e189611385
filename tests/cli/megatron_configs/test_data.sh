# Sourced by tests/cli/megatron_configs_*.sh: makes the test data in $WORK (a synthetic GPT-2-sized BPE
# vocabulary, a preprocessed JSONL corpus, a SentencePiece model when the trainer is built in) and
# exports the placeholders the .args files use (Megatron's CI fills the same names with its paths).
# Needs WORK, MAKE (fp8tron_make_megatron_test_data) and PRE (fp8tron-preprocess).
"$MAKE" "$WORK" >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log"; exit 2; }
"$PRE" --input "$WORK/corpus.jsonl" --output-prefix "$WORK/corpus" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$WORK/vocab.json" --merge-file "$WORK/merges.txt" --append-eod --workers 2 >"$WORK/pre.log" 2>&1 ||
  { cat "$WORK/pre.log"; exit 2; }
export DATA_PATH="$WORK/corpus_text_document" VOCAB_FILE="$WORK/vocab.json" MERGE_FILE="$WORK/merges.txt"
export TOKENIZER_MODEL="$WORK/sp.model" CHECKPOINT_SAVE_PATH="$WORK/save" CHECKPOINT_LOAD_PATH="$WORK/load"
export TENSORBOARD_PATH="$WORK/tb" DATA_CACHE_PATH="$WORK/cache" WANDB_SAVE_PATH="$WORK/wandb" WANDB_EXPERIMENT=dry-run
# The overlap test's userbuffer configuration is a file of Megatron's test tree: ours keeps every
# GEMM at Transformer Engine's default method.
printf '# every GEMM at its default overlap method\n' >"$WORK/tp_comm_overlap_cfg.yaml"
export TP_COMM_OVERLAP_CFG="$WORK/tp_comm_overlap_cfg.yaml"
