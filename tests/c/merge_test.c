/* C client of include/memtrace_merge.h, run by tests/ffi_c.rs:
 *     merge_test DATA_DIR TMP_DIR
 * DATA_DIR is tests/data; TMP_DIR an empty scratch directory. Prints one line per check and
 * exits non-zero when any fails. */

#include "memtrace_merge.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                                    \
  do {                                                                                      \
    checks++;                                                                               \
    if (cond) {                                                                             \
      printf("ok: ");                                                                       \
    } else {                                                                                \
      failures++;                                                                           \
      printf("FAILED (%s:%d: %s): ", __FILE__, __LINE__, #cond);                           \
    }                                                                                       \
    printf(__VA_ARGS__);                                                                    \
    printf("\n");                                                                           \
  } while (0)

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The whole file, or NULL; *len receives its size. */
static unsigned char *slurp(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*len ? *len : 1);
  if (fread(b, 1, *len, f) != (size_t)*len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  return b;
}

static int is_error(MemtraceMergeStatus s) { return s > MEMTRACE_MERGE_STATUS_OK_WITH_WARNINGS; }

static const char *name(MemtraceMergeStatus s) { return memtrace_merge_status_string((int)s); }

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s DATA_DIR TMP_DIR\n", argv[0]);
    return 2;
  }
  const char *data = argv[1], *tmp = argv[2];
  char *fork_dir = join(data, "fork");
  const char *names[5] = {"parent.ctf", "child-1.ctf", "child-2.ctf", "child-3.ctf", "child-4.ctf"};
  const uint64_t allocs[5] = {88445, 8336, 17914, 100716, 16499};
  const char *inputs[5];
  for (int i = 0; i < 5; i++) inputs[i] = join(fork_dir, names[i]);
  char err[1024];
  MemtraceMergeStatus s;

  printf("memtrace_merge version %s\n", memtrace_merge_version());
  CHECK(strcmp(memtrace_merge_version(), "") != 0, "version is not empty");
  CHECK(strncmp(name(MEMTRACE_MERGE_STATUS_INPUT_ERROR), "INPUT_ERROR", 11) == 0, "status string");
  CHECK(strcmp(memtrace_merge_status_string(42), "unknown status") == 0, "unknown status string");

  /* The real merge: five processes of one fork scenario. */
  {
    char *out = join(tmp, "merged.ctf");
    MemtraceMergeInputReport per[6];
    memset(per, 0xff, sizeof per);
    MemtraceMergeReport r;
    memset(&r, 0xff, sizeof r);
    r.struct_size = sizeof r;
    r.inputs = per;
    r.inputs_capacity = 6;
    s = memtrace_merge(inputs, 5, out, NULL, &r, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_OK || s == MEMTRACE_MERGE_STATUS_OK_WITH_WARNINGS,
          "merge of the fork traces: %s (%s)", name(s), err);
    CHECK(r.allocs == 231910, "allocs %llu == 231910", (unsigned long long)r.allocs);
    CHECK(r.promotes == 30463, "promotes %llu == 30463", (unsigned long long)r.promotes);
    CHECK(r.collects == 223009, "collects %llu == 223009", (unsigned long long)r.collects);
    CHECK(r.input_allocs == 231910, "input_allocs %llu == 231910", (unsigned long long)r.input_allocs);
    CHECK(r.input_events == 231910 + 30463 + 223009, "input_events %llu",
          (unsigned long long)r.input_events);
    CHECK(r.n_inputs == 5 && r.n_inputs_skipped == 0 && r.n_inputs_thinned == 0,
          "5 inputs, none skipped or thinned (%llu, %llu, %llu)", (unsigned long long)r.n_inputs,
          (unsigned long long)r.n_inputs_skipped, (unsigned long long)r.n_inputs_thinned);
    CHECK(r.format == 2, "output format %u == 2 (all inputs are v2)", r.format);
    CHECK(r.inputs == per && r.inputs_capacity == 6, "caller's array fields kept");
    for (int i = 0; i < 5; i++)
      CHECK(per[i].arg_index == (size_t)i && per[i].allocs == allocs[i] && per[i].format == 2 &&
                per[i].keep_fraction == 1.0 && !per[i].skipped,
            "input %d (%s): arg_index %zu, allocs %llu", i, names[i], per[i].arg_index,
            (unsigned long long)per[i].allocs);
    CHECK(per[5].allocs == UINT64_MAX, "the array is not written past n_inputs");
    for (int i = 0; i < 5; i++)
      CHECK(per[i].file_name[0] == 0, "input %d: a file argument has no file_name (\"%s\")", i,
            per[i].file_name);
    CHECK(file_size(out) > 0, "output %s exists (%ld bytes)", out, file_size(out));

    /* A directory argument: each report names its file in the directory. */
    {
      const char *dir_arg[1] = {fork_dir};
      MemtraceMergeInputReport dper[5];
      MemtraceMergeReport dr = {0};
      dr.inputs = dper;
      dr.inputs_capacity = 5;
      char *dout = join(tmp, "merged-dir.ctf");
      s = memtrace_merge(dir_arg, 1, dout, NULL, &dr, err, sizeof err);
      CHECK(!is_error(s) && dr.n_inputs == 5, "directory merge: %s, %llu inputs", name(s),
            (unsigned long long)dr.n_inputs);
      const char *sorted[5] = {"child-1.ctf", "child-2.ctf", "child-3.ctf", "child-4.ctf",
                               "parent.ctf"};
      for (int i = 0; i < 5; i++)
        CHECK(dper[i].arg_index == 0 && strcmp(dper[i].file_name, sorted[i]) == 0,
              "directory input %d names %s (\"%s\")", i, sorted[i], dper[i].file_name);
    }

    /* The same with a NULL report and errbuf, and explicit options. */
    char *out3 = join(tmp, "merged-v3.ctf");
    MemtraceMergeOptions o = {0};
    o.format = MEMTRACE_MERGE_FORMAT_V3;
    o.seed = 7;
    o.pid = 4242;
    o.context = "merged by merge_test.c";
    s = memtrace_merge(inputs, 5, out3, &o, NULL, NULL, 0);
    CHECK(!is_error(s), "merge with options, NULL report and errbuf: %s", name(s));
    CHECK(file_size(out3) > 0, "output %s exists", out3);
  }

  /* A cancel flag set: the merge stops, nothing is written. */
  {
    char *out_c = join(tmp, "cancelled.ctf");
    int flag = 1;
    MemtraceMergeOptions o = {0};
    o.struct_size = sizeof o;
    o.cancel = &flag;
    MemtraceMergeStatus s = memtrace_merge(inputs, 5, out_c, &o, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_CANCELLED, "cancelled merge: %s (%s)", name(s), err);
    CHECK(file_size(out_c) < 0, "no output %s after a cancelled merge", out_c);
    flag = 0;
    s = memtrace_merge(inputs, 5, out_c, &o, NULL, err, sizeof err);
    CHECK(!is_error(s) && file_size(out_c) > 0, "the flag down again: %s", name(s));
  }

  /* Thinning or refusing inputs sampled at different rates. */
  {
    char *rates[2] = {join(data, "rates/fast.ctf"), join(data, "rates/slow.ctf")};
    char *out = join(tmp, "rates.ctf");
    MemtraceMergeReport r = {0};
    s = memtrace_merge((const char *const *)rates, 2, out, NULL, &r, err, sizeof err);
    CHECK(!is_error(s) && r.n_inputs_thinned == 1 && r.allocs < r.input_allocs,
          "fast + slow thinned by default: %s, thinned %llu, allocs %llu of %llu (%s)", name(s),
          (unsigned long long)r.n_inputs_thinned, (unsigned long long)r.allocs,
          (unsigned long long)r.input_allocs, err);
    char *out2 = join(tmp, "rates-fail.ctf");
    MemtraceMergeOptions o = {0};
    o.on_rate_mismatch = MEMTRACE_MERGE_RATE_FAIL;
    s = memtrace_merge((const char *const *)rates, 2, out2, &o, &r, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_INPUT_ERROR, "fast + slow with RATE_FAIL: %s (%s)", name(s), err);
    CHECK(file_size(out2) < 0, "no output after a refused merge");
    CHECK(r.allocs == 0 && r.n_inputs == 0, "report zeroed after an error");
  }

  /* Bad arguments. */
  {
    char *out = join(tmp, "bad.ctf");
    err[0] = 'x';
    s = memtrace_merge(NULL, 5, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS && strstr(err, "NULL"), "NULL inputs: %s (%s)",
          name(s), err);
    s = memtrace_merge(inputs, 0, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS && err[0], "zero inputs: %s (%s)", name(s), err);
    s = memtrace_merge(inputs, 5, NULL, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, "NULL output: %s (%s)", name(s), err);
    s = memtrace_merge(inputs, 5, "", NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, "empty output: %s (%s)", name(s), err);
    const char *with_null[2] = {inputs[0], NULL};
    s = memtrace_merge(with_null, 2, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS && strstr(err, "inputs[1]"),
          "a NULL input: %s (%s)", name(s), err);
    s = memtrace_merge(inputs, (size_t)-1, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, "absurd n_inputs: %s (%s)", name(s), err);
    MemtraceMergeOptions o = {0};
    o.format = 1;
    s = memtrace_merge(inputs, 5, out, &o, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, "format 1: %s (%s)", name(s), err);
    o.format = 0;
    o.on_rate_mismatch = 2;
    s = memtrace_merge(inputs, 5, out, &o, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS, "rate policy 2: %s (%s)", name(s), err);
    CHECK(file_size(out) < 0, "no output after bad arguments");
  }

  /* A missing input. */
  {
    char *missing = join(tmp, "no-such-trace.ctf");
    const char *in[2] = {inputs[1], missing};
    char *out = join(tmp, "missing.ctf");
    s = memtrace_merge(in, 2, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_INPUT_ERROR && strstr(err, "no-such-trace.ctf"),
          "missing input: %s (%s)", name(s), err);
    CHECK(file_size(out) < 0, "no output after a missing input");
  }

  /* Not a trace. */
  {
    char *readme = join(data, "README.md");
    const char *in[2] = {inputs[1], readme};
    char *out = join(tmp, "readme.ctf");
    s = memtrace_merge(in, 2, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_INPUT_ERROR && strstr(err, "README.md"),
          "not a trace: %s (%s)", name(s), err);
    CHECK(file_size(out) < 0, "no output after a bad input");
  }

  /* The output is one of the inputs: refused, and the input left as it was. */
  {
    char *victim = join(tmp, "victim.ctf");
    long len0 = 0, len1 = 0;
    unsigned char *orig = slurp(inputs[1], &len0);
    FILE *f = fopen(victim, "wb");
    fwrite(orig, 1, len0, f);
    fclose(f);
    const char *in[2] = {inputs[2], victim};
    s = memtrace_merge(in, 2, victim, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS || s == MEMTRACE_MERGE_STATUS_INPUT_ERROR,
          "output == input: %s (%s)", name(s), err);
    unsigned char *after = slurp(victim, &len1);
    CHECK(after && len1 == len0 && memcmp(orig, after, len0) == 0, "the input is unchanged");
  }

  /* An output that cannot be written. */
  {
    s = memtrace_merge(inputs, 2, "/proc/nonexistent/out.ctf", NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_OUTPUT_ERROR, "output in a missing directory: %s (%s)",
          name(s), err);
    char *file = join(tmp, "a-file");
    FILE *f = fopen(file, "wb");
    fclose(f);
    char *out = join(file, "out.ctf");
    s = memtrace_merge(inputs, 2, out, NULL, NULL, err, sizeof err);
    CHECK(s == MEMTRACE_MERGE_STATUS_OUTPUT_ERROR, "output under a regular file: %s (%s)", name(s),
          err);
  }

  /* A small errbuf: truncated, NUL-terminated, nothing written past it. */
  {
    char small[16];
    memset(small, 'Z', sizeof small);
    s = memtrace_merge(NULL, 1, "x", NULL, NULL, small, 8);
    CHECK(s == MEMTRACE_MERGE_STATUS_BAD_ARGUMENTS && strlen(small) == 7 && small[7] == 0 &&
              small[8] == 'Z',
          "errbuf of 8 bytes holds \"%s\"", small);
    memset(small, 'Z', sizeof small);
    s = memtrace_merge(NULL, 1, "x", NULL, NULL, small, 1);
    CHECK(small[0] == 0 && small[1] == 'Z', "errbuf of 1 byte holds \"\"");
    memset(small, 'Z', sizeof small);
    s = memtrace_merge(NULL, 1, "x", NULL, NULL, small, 0);
    CHECK(small[0] == 'Z', "errbuf of 0 bytes is not written");
  }

  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
