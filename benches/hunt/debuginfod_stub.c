/* A stand-in for elfutils' libdebuginfod.so.1, carried to a GPU server with Debian's
 * gdb-minimal (benches/gpu-report.sh hunt): gdb links it, but the real one pulls in libcurl
 * and its TLS stack. Every lookup answers "not found", so gdb reads only local symbols. */
#include <errno.h>
#include <stddef.h>
typedef struct debuginfod_client debuginfod_client;
debuginfod_client *debuginfod_begin(void) { return NULL; }
void debuginfod_end(debuginfod_client *c) { (void)c; }
int debuginfod_find_debuginfo(debuginfod_client *c, const unsigned char *id, int n, char **p) { (void)c; (void)id; (void)n; (void)p; return -ENOSYS; }
int debuginfod_find_executable(debuginfod_client *c, const unsigned char *id, int n, char **p) { (void)c; (void)id; (void)n; (void)p; return -ENOSYS; }
int debuginfod_find_source(debuginfod_client *c, const unsigned char *id, int n, const char *f, char **p) { (void)c; (void)id; (void)n; (void)f; (void)p; return -ENOSYS; }
void *debuginfod_get_user_data(debuginfod_client *c) { (void)c; return NULL; }
void debuginfod_set_user_data(debuginfod_client *c, void *d) { (void)c; (void)d; }
void debuginfod_set_progressfn(debuginfod_client *c, void *f) { (void)c; (void)f; }
