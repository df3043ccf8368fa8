/* merge OUT IN...: merge memtrace traces (files or directories) into OUT with the C ABI.
   Build: cc -I include example.c target/release/libmemtrace_merge.a -lpthread -ldl -lm */
#include <stdio.h>

#include "memtrace_merge.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s OUT IN...\n", argv[0]);
    return 2;
  }
  MemtraceMergeInputReport per[64];
  MemtraceMergeReport report = {0};
  report.inputs = per;
  report.inputs_capacity = 64;
  char err[512];
  /* NULL options: the defaults (a zeroed MemtraceMergeOptions is the same) */
  MemtraceMergeStatus st = memtrace_merge((const char *const *)(argv + 2), (size_t)(argc - 2),
                                          argv[1], NULL, &report, err, sizeof err);
  if (st != MEMTRACE_MERGE_STATUS_OK && st != MEMTRACE_MERGE_STATUS_OK_WITH_WARNINGS) {
    fprintf(stderr, "%s: %s\n", memtrace_merge_status_string(st), err);
    return 1;
  }
  for (size_t i = 0; i < report.n_inputs && i < 64; i++)
    printf("%s%s%s: %llu allocations\n", argv[2 + per[i].arg_index], per[i].file_name[0] ? "/" : "",
           per[i].file_name, (unsigned long long)per[i].allocs);
  printf("%s: %llu allocations, %llu promotions, %llu collections\n", argv[1],
         (unsigned long long)report.allocs, (unsigned long long)report.promotes,
         (unsigned long long)report.collects);
  if (err[0]) printf("first warning: %s\n", err);
  return 0;
}
