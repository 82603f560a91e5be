/* Callgrind client requests for bench/_worker.py's `instructions` part, loaded through ctypes.

   Instrumentation runs only between vc_begin() and vc_end(): the interpreter start, vLLM's import and the
   model builds run uninstrumented (valgrind --instr-atstart=no), the timed call is counted instruction by
   instruction, and vc_end dumps the count under the call's label (parsed by bench/run.py). */
#include <valgrind/callgrind.h>

void vc_begin(void) {
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
}

void vc_end(const char *label) {
    CALLGRIND_DUMP_STATS_AT(label);
    CALLGRIND_STOP_INSTRUMENTATION;
}

/* 1 under valgrind, 0 otherwise: the worker refuses to report counts it did not take. */
int vc_running_on_valgrind(void) {
    return RUNNING_ON_VALGRIND;
}
