# nightshift — one Makefile for everything.
#   make                          build/nightshift (CPU backend)
#   make run [PORT=8080] [ARGS=...]  set up, build, serve the demo model on 127.0.0.1
#   make test                     set up, build and run the whole suite (tests/run)
#   (run and test first call scripts/setup, which installs what is missing;
#    SETUP=0 skips it)
#   make SANITIZE=address,undefined [test]   same under ASan/UBSan, in build/san
#   make CUDA=1                   add the CUDA backend (nvcc), in build/cuda
#   make bench                    build the benchmark binaries
#   make fuzz / fuzz-smoke [FUZZ_SECONDS=60]  libFuzzer harnesses (clang, ASan/UBSan), build/fuzz
CC      ?= cc
NVCC    ?= nvcc
OPT     ?= -O2
WERROR  ?=
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90

ifdef SANITIZE
BUILD   ?= build/san
SANFLAGS = -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=undefined -DNS_DEBUG_CHECKS=1
OPT      = -O1
else ifdef CUDA
BUILD   ?= build/cuda
else
BUILD   ?= build
endif

WARN    = -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes \
          -Wformat=2 -Wno-unused-parameter -Wvla $(if $(WERROR),-Werror,)
CFLAGS  += -std=c11 $(OPT) -g -pthread -D_GNU_SOURCE -Isrc -MMD -MP $(WARN) $(SANFLAGS) -march=native
# `nightshift --version` commit (src/version.h), given to main.o only; a stale main.o is deleted when it changes.
NS_GIT_COMMIT := $(shell c=$$(git rev-parse --short HEAD 2>/dev/null) || c=unknown; [ $$c = unknown ] || [ -z "$$(git --no-optional-locks status --porcelain 2>/dev/null)" ] || c=$$c-dirty; echo $$c)
$(BUILD)/obj/src/main.o: CFLAGS += -DNS_GIT_COMMIT='"$(NS_GIT_COMMIT)"'
$(shell [ "$$(cat $(BUILD)/.commit 2>/dev/null)" = "$(NS_GIT_COMMIT)" ] || { rm -f $(BUILD)/obj/src/main.o; mkdir -p $(BUILD); echo "$(NS_GIT_COMMIT)" >$(BUILD)/.commit; })
LDFLAGS += -pthread $(SANFLAGS)
LDLIBS  += -lopenblas -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lsqlite3 -lcurl -lm

LIB_SRC := $(shell find src -name '*.c' ! -name main.c | sort)
CU_SRC  :=
ifdef CUDA
CUDA_HOME ?= /usr/local/cuda
CFLAGS  += -DNS_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CU_SRC  := $(shell find src/backend/cuda -name '*.cu' | sort)
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++
NVFLAGS ?= -O3 -std=c++17 -MMD -MP $(CUDA_ARCH) -Isrc -Xcompiler -fPIC,-Wall --expt-relaxed-constexpr
endif

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
# Unit tests mirror src/: tests/unit/<module>/test_*.c. Every test binary
# lands flat in $(BUILD)/tests/ (tests/run runs $(BUILD)/tests/test_*), so
# test file names must be unique across directories.
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c tests/unit/*/test_*.c tests/golden/test_*.c))
TEST_BIN := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_SRC)))
ifneq ($(words $(sort $(TEST_BIN))),$(words $(TEST_BIN)))
$(error two test files share a name: $(sort $(notdir $(TEST_SRC))) vs $(notdir $(TEST_SRC)))
endif
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all test tests bench clean
all: $(BUILD)/nightshift

$(BUILD)/libnightshift.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/nightshift: $(BUILD)/obj/src/main.o $(BUILD)/libnightshift.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# The dashboard page (src/dashboard/dashboard.html) is compiled into the
# binary as a C array (src/dashboard/embed.sh), for this build and the fuzz build.
%/gen/dashboard_page.h: src/dashboard/dashboard.html src/dashboard/embed.sh
	@mkdir -p $(@D)
	src/dashboard/embed.sh $< $@ ns_dashboard_page
$(BUILD)/obj/src/api/dashboard.o: $(BUILD)/gen/dashboard_page.h
$(BUILD)/obj/src/api/dashboard.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<
# wgmma/setmaxnreg exist only in the arch-specific sm_90a target; the
# kernel is selected at run time on compute capability 9.0 only.
$(BUILD)/obj/src/backend/cuda/cuda_attn_sm90.cu.o: CUDA_ARCH = -gencode arch=compute_90a,code=sm_90a

# One rule per test source: $(BUILD)/tests/test_x <- tests/.../test_x.c
define TEST_RULE
$(BUILD)/tests/$(basename $(notdir $(1))): $(1) $(BUILD)/libnightshift.a
	@mkdir -p $$(@D)
	$$(CC) $$(CFLAGS) -Itests -o $$@ $$< $(BUILD)/libnightshift.a $$(LDFLAGS) $$(LDLIBS)
endef
$(foreach t,$(TEST_SRC),$(eval $(call TEST_RULE,$(t))))

$(BUILD)/bench/%: bench/%.c $(BUILD)/libnightshift.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libnightshift.a $(LDFLAGS) $(LDLIBS)

tests: $(BUILD)/nightshift $(TEST_BIN)

# GPU tests (tests/gpu) and the engine benchmark binary: built only with
# CUDA=1 (`make CUDA=1 gpu-tests`), run by tests/gpu/run.sh on a machine
# with a GPU; CI only compiles them. They link a core library (util,
# sample, backend, engine, model, cli bench) instead of the whole tree, so the GPU
# runs do not depend on the server/tokenizer/template code compiling.
ifdef CUDA
CORE_SRC := $(shell find src/util src/sample src/backend src/engine src/model src/kv src/sched src/grammar -name '*.c' | sort) src/cli/cli_bench_engine.c
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
GPU_LDLIBS := -lopenblas -ljansson -lxxhash -lsqlite3 -lm -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(patsubst tests/gpu/%.c,$(BUILD)/gpu-tests/%,$(GPU_TEST_SRC))
.PHONY: gpu-tests
gpu-tests: $(GPU_TEST_BIN) $(BUILD)/gpu-tests/bench_engine $(BUILD)/gpu-tests/bench_tiers $(BUILD)/gpu-tests/bench_kv_ssd

$(BUILD)/libns_core.a: $(CORE_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/gpu-tests/%: tests/gpu/%.c $(BUILD)/libns_core.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libns_core.a $(LDFLAGS) $(GPU_LDLIBS)

$(BUILD)/gpu-tests/bench_engine: bench/bench_engine_main.c $(BUILD)/libns_core.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libns_core.a $(LDFLAGS) $(GPU_LDLIBS)

$(BUILD)/gpu-tests/bench_%: bench/bench_%.c $(BUILD)/libns_core.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libns_core.a $(LDFLAGS) $(GPU_LDLIBS)

# bench/cupti_trace.c: an LD_PRELOAD kernel timeline (graph nodes included)
# for the decode accounting; built with the GPU tests where the toolkit
# has CUPTI (its header and library sit in lib64/, lib/ or extras/CUPTI/).
CUPTI_INC := $(firstword $(dir $(wildcard $(CUDA_HOME)/include/cupti.h $(CUDA_HOME)/extras/CUPTI/include/cupti.h)))
.PHONY: cupti-trace
cupti-trace: $(BUILD)/libns_cupti_trace.so
$(BUILD)/libns_cupti_trace.so: bench/cupti_trace.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -shared -I$(CUPTI_INC) -o $@ $< -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib \
	    -L$(CUDA_HOME)/extras/CUPTI/lib64 -lcupti
ifneq ($(CUPTI_INC),)
gpu-tests: $(BUILD)/libns_cupti_trace.so
endif
endif

# `make run` and `make test` first run scripts/setup: it installs what is
# missing (Debian packages, the npm test clients) and is quick when nothing
# is. SETUP=0 skips it. The build then runs in a sub-make so that it starts
# only after setup, also under -j.
SETUP ?= 1
PORT  ?= 8080
ARGS  ?=
.PHONY: setup run
setup:
ifneq ($(SETUP),0)
	scripts/setup
endif

test: setup
	@$(MAKE) --no-print-directory tests
	tests/run $(BUILD)

# Serves build/nightshift on 127.0.0.1:$(PORT); without --model in ARGS that
# is the built-in demo model (random weights: its output is noise).
run: setup
	@$(MAKE) --no-print-directory $(BUILD)/nightshift
	@echo "nightshift: serving on http://127.0.0.1:$(PORT) (Ctrl-C stops it)"
	@echo "  point an OpenAI client at it:  OPENAI_BASE_URL=http://127.0.0.1:$(PORT)/v1  (any API key)"
	@echo "  try:  curl -s http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":\"nightshift\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'"
	exec $(BUILD)/nightshift serve --host 127.0.0.1 --port $(PORT) $(ARGS)

bench: $(BUILD)/nightshift $(BENCH_BIN)

# Fuzzers (tests/fuzz/fuzz_*.c, libFuzzer): `make fuzz` builds them with
# clang under ASan/UBSan into build/fuzz (the library is rebuilt there with
# coverage instrumentation); `make fuzz-smoke [FUZZ_SECONDS=60]` runs each on
# its seeds (tests/fuzz/corpus/<name>/) for FUZZ_SECONDS, FUZZ_JOBS at a
# time, and fails on any finding (tests/fuzz/smoke).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -std=c11 -O1 -g -pthread -D_GNU_SOURCE -Isrc -MMD -MP -march=native -DNS_DEBUG_CHECKS=1 \
                -Wall -Wno-unused-parameter $(FUZZ_SAN)
FUZZ_SRC     := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)
.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_BIN)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/obj/src/api/dashboard.o: $(FUZZ_BUILD)/gen/dashboard_page.h
$(FUZZ_BUILD)/obj/src/api/dashboard.o: FUZZ_CFLAGS += -I$(FUZZ_BUILD)/gen

$(FUZZ_BUILD)/libnightshift.a: $(FUZZ_LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libnightshift.a
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Itests/fuzz -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libnightshift.a $(LDLIBS)

fuzz-smoke: fuzz
	tests/fuzz/smoke $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_JOBS)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj $(BUILD)/tests $(BUILD)/bench $(BUILD)/gpu-tests -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
