/*
 * advertise.h: DNS-SD advertising of a runner as _metal-runner._tcp.
 *
 * Exactly one implementation is built (the Makefile and CMakeLists.txt
 * choose): advertise_dnssd.c on macOS (dns_sd.h, in libSystem),
 * advertise_avahi.c on Linux where Avahi's client library is present, and
 * advertise_none.c elsewhere, where --advertise is an error.
 *
 * The TXT record: txtvers=1, proto=1 (the protocol version), backend=cpu
 * or metal, auth=1 if a token is required, else auth=0.
 */
#ifndef ADVERTISE_H
#define ADVERTISE_H

#define ADV_TYPE "_metal-runner._tcp"

extern const int adv_available;		/* 0: adv_start() always fails */
extern const char *const adv_missing;	/* why not, when unavailable */

/* Advertise the runner listening on host:port under name ("": the
 * host's name); 0 once registered, -1 with a message in err. The
 * advertisement ends when the process exits. */
int adv_start(const char *name, const char *host, int port,
    const char *backend, int auth, char *err, size_t errlen);

#endif
