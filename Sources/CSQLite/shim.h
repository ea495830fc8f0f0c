#ifndef KEYCHAIND_CSQLITE_SHIM_H
#define KEYCHAIND_CSQLITE_SHIM_H
#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast expression that Swift cannot import. */
static inline sqlite3_destructor_type keychaind_sqlite_transient(void) { return SQLITE_TRANSIENT; }
/* sqlite3_config is variadic, which Swift cannot call. Turns off SQLite's memory statistics (a
   process-wide mutex and counters on every allocation; nothing here reads them) and initialises the
   library. Must run before the first connection opens; SQLITE_MISUSE when the library was already
   initialised, which only costs the statistics. */
static inline int keychaind_sqlite_configure(void) {
    int rc = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    int init = sqlite3_initialize();
    return rc != SQLITE_OK ? rc : init;
}
#endif
