#ifndef KEYCHAIND_CSYSTEMD_SHIM_H
#define KEYCHAIND_CSYSTEMD_SHIM_H
/* sd-bus (Debian's libsystemd-dev): the D-Bus library of the Secret Service. Swift cannot call C
 * variadic functions; every call used has a non-variadic form but the error constructor, a macro. */
/* Packages build with -D_FORTIFY_SOURCE: its inline wrappers of libc functions (realpath, read…) would
 * be defined here and in Swift's Glibc module, and the two definitions clash. Only the declarations
 * are needed here; the C these headers declare is compiled elsewhere, fortified. */
#undef _FORTIFY_SOURCE
#include <systemd/sd-bus.h>

/* sd_bus_error for a reply: name and message stay owned by the caller (no free). */
static inline sd_bus_error kc_bus_error(const char *name, const char *message) {
    sd_bus_error e = SD_BUS_ERROR_MAKE_CONST(name, message);
    return e;
}

#endif
