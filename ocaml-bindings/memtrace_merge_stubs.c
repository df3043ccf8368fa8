/* OCaml stub of Memtrace_merge.merge: copies the arguments into C memory, calls the Rust
 * library's memtrace_merge() (include/memtrace_merge.h) without the OCaml runtime lock, and
 * raises Memtrace_merge.Error on failure. */

#define CAML_NAME_SPACE
#include <caml/alloc.h>
#include <caml/bigarray.h>
#include <caml/callback.h>
#include <caml/fail.h>
#include <caml/memory.h>
#include <caml/mlvalues.h>
#include <caml/signals.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace_merge.h"

/* Size of the message buffer: errors name a file and a byte offset, and paths can be long. */
#define ERRBUF_LEN 8192

/* Fields of the OCaml record Memtrace_merge.c_options (keep in step with memtrace_merge.ml). */
enum { OPT_FORMAT, OPT_RATE, OPT_SEED, OPT_TAG, OPT_SKIP, OPT_PID, OPT_CONTEXT, OPT_CAPACITY, OPT_CANCEL };

/* Raise Memtrace_merge.Error { status; message }. status is the C status (2 to 6); the OCaml
 * variant Bad_arguments | Input_error | Output_error | Internal_error | Cancelled is numbered
 * from 0. */
static void raise_error(int status, const char *message) {
  CAMLparam0();
  CAMLlocal2(msg, err);
  const value *exn = caml_named_value("Memtrace_merge.Error");
  if (exn == NULL) caml_failwith(message); /* the OCaml module registers it at start-up */
  int tag = status - MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS;
  if (tag < 0 || tag > 4) tag = 3;
  msg = caml_copy_string(message);
  err = caml_alloc_small(2, 0);
  Field(err, 0) = Val_int(tag);
  Field(err, 1) = msg;
  caml_raise_with_arg(*exn, err);
  CAMLnoreturn;
}

/* Everything the call needs, in C memory, so that no OCaml value is touched while the runtime
 * lock is released. */
struct call {
  size_t n_inputs;
  char **inputs;
  char *output;
  char *context;
  MemtraceMergeOptions options;
  MemtraceMergeInputReport *per_input;
  MemtraceMergeReport report;
  char errbuf[ERRBUF_LEN];
};

static void free_call(struct call *c) {
  if (c == NULL) return;
  if (c->inputs != NULL)
    for (size_t i = 0; i < c->n_inputs; i++) free(c->inputs[i]);
  free(c->inputs);
  free(c->output);
  free(c->context);
  free(c->per_input);
  free(c);
}

/* A malloc'd copy of an OCaml string, or NULL when it holds a NUL byte (*bad is set) or when
 * memory runs out. */
static char *copy_c_string(value s, int *bad) {
  if (!caml_string_is_c_safe(s)) {
    *bad = 1;
    return NULL;
  }
  size_t n = caml_string_length(s);
  char *p = malloc(n + 1);
  if (p != NULL) memcpy(p, String_val(s), n + 1);
  return p;
}

static void fail_call(struct call *c, const char *what, int bad) {
  char message[512];
  free_call(c);
  if (!bad) caml_raise_out_of_memory();
  snprintf(message, sizeof message, "Memtrace_merge.merge: %s contains a NUL byte", what);
  raise_error(MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, message);
}

static value val_u64(uint64_t x) { return Val_long((intnat)x); }

/* memtrace_merge_ml : string array -> string -> c_options -> raw_report
 * raw_report = (first_warning : string, totals : int array,
 *               per_input : (int array * (float * float)) array) */
value memtrace_merge_ml(value v_inputs, value v_output, value v_options) {
  CAMLparam3(v_inputs, v_output, v_options);
  CAMLlocal5(result, totals, per, ints, floats);
  CAMLlocal5(pair, warning, rate, keep, name);
  int bad = 0;

  struct call *c = calloc(1, sizeof *c);
  if (c == NULL) caml_raise_out_of_memory();
  c->n_inputs = Wosize_val(v_inputs);
  c->inputs = calloc(c->n_inputs ? c->n_inputs : 1, sizeof *c->inputs);
  if (c->inputs == NULL) fail_call(c, "", 0);
  for (size_t i = 0; i < c->n_inputs; i++) {
    c->inputs[i] = copy_c_string(Field(v_inputs, i), &bad);
    if (c->inputs[i] == NULL) fail_call(c, "an input path", bad);
  }
  c->output = copy_c_string(v_output, &bad);
  if (c->output == NULL) fail_call(c, "the output path", bad);
  value v_context = Field(v_options, OPT_CONTEXT);
  if (Is_block(v_context)) {
    c->context = copy_c_string(Field(v_context, 0), &bad);
    if (c->context == NULL) fail_call(c, "the context", bad);
  }
  c->options.format = (uint32_t)Long_val(Field(v_options, OPT_FORMAT));
  c->options.on_rate_mismatch = (uint32_t)Long_val(Field(v_options, OPT_RATE));
  c->options.seed = (uint64_t)Long_val(Field(v_options, OPT_SEED));
  c->options.tag_processes = Bool_val(Field(v_options, OPT_TAG));
  c->options.skip_bad_inputs = Bool_val(Field(v_options, OPT_SKIP));
  c->options.pid = (uint64_t)Long_val(Field(v_options, OPT_PID));
  c->options.context = c->context;
  c->options.struct_size = sizeof c->options;
  /* The cancel flag: the data of an int32 bigarray (out of the OCaml heap, so it does not
   * move; it stays alive as v_options, a root of this call, refers to it). */
  value v_cancel = Field(v_options, OPT_CANCEL);
  if (Is_block(v_cancel)) c->options.cancel = (const int *)Caml_ba_data_val(Field(v_cancel, 0));
  size_t capacity = (size_t)Long_val(Field(v_options, OPT_CAPACITY));
  if (capacity > 0) {
    c->per_input = calloc(capacity, sizeof *c->per_input);
    if (c->per_input == NULL) fail_call(c, "", 0);
  }
  c->report.struct_size = sizeof c->report;
  c->report.inputs = c->per_input;
  c->report.inputs_capacity = capacity;

  /* The merge reads and writes files for a while: let other OCaml threads run meanwhile. */
  caml_enter_blocking_section();
  MemtraceMergeStatus status =
      memtrace_merge((const char *const *)c->inputs, c->n_inputs, c->output, &c->options,
                     &c->report, c->errbuf, sizeof c->errbuf);
  caml_leave_blocking_section();

  if (status != MEMTRACE_MERGE_STATUS_OK && status != MEMTRACE_MERGE_STATUS_OK_WITH_WARNINGS) {
    char message[ERRBUF_LEN];
    memcpy(message, c->errbuf, sizeof message);
    free_call(c);
    raise_error((int)status, message);
  }

  const MemtraceMergeReport *r = &c->report;
  warning = caml_copy_string(c->errbuf);
  uint64_t t[] = {r->n_inputs,       r->n_inputs_skipped, r->n_inputs_thinned, r->format,
                  r->allocs,         r->promotes,         r->collects,         r->remapped_codes,
                  r->warnings,       r->input_events,     r->input_allocs,     r->samples_read,
                  r->samples_written, r->skipped_packets};
  size_t nt = sizeof t / sizeof t[0];
  totals = caml_alloc(nt, 0);
  for (size_t i = 0; i < nt; i++) Store_field(totals, i, val_u64(t[i]));
  size_t n = r->n_inputs < capacity ? (size_t)r->n_inputs : capacity;
  per = caml_alloc(n, 0);
  for (size_t i = 0; i < n; i++) {
    const MemtraceMergeInputReport *p = &c->per_input[i];
    intnat arg = p->arg_index == MEMTRACE_MERGE_UNKNOWN_ARG ? -1 : (intnat)p->arg_index;
    uint64_t u[] = {p->pid,           p->format,         p->skipped != 0,  p->events,
                    p->allocs,        p->promotes,       p->collects,      p->allocs_written,
                    p->samples_read,  p->samples_written, p->skipped_packets, p->remapped_codes,
                    p->warnings};
    size_t nu = sizeof u / sizeof u[0];
    ints = caml_alloc(nu + 1, 0);
    Store_field(ints, 0, Val_long(arg));
    for (size_t k = 0; k < nu; k++) Store_field(ints, k + 1, val_u64(u[k]));
    rate = caml_copy_double(p->sample_rate);
    keep = caml_copy_double(p->keep_fraction);
    floats = caml_alloc_tuple(2);
    Store_field(floats, 0, rate);
    Store_field(floats, 1, keep);
    name = caml_copy_string(p->file_name);
    pair = caml_alloc_tuple(3);
    Store_field(pair, 0, ints);
    Store_field(pair, 1, floats);
    Store_field(pair, 2, name);
    Store_field(per, i, pair);
  }
  free_call(c);
  result = caml_alloc_tuple(3);
  Store_field(result, 0, warning);
  Store_field(result, 1, totals);
  Store_field(result, 2, per);
  CAMLreturn(result);
}

value memtrace_merge_version_ml(value unit) {
  CAMLparam1(unit);
  CAMLreturn(caml_copy_string(memtrace_merge_version()));
}
