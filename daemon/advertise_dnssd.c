/*
 * advertise_dnssd.c: DNS-SD on macOS through dns_sd.h (mDNSResponder, in
 * libSystem: no library to link).
 *
 * NOT VERIFIED: written from Apple's dns_sd.h documentation; it has never
 * been compiled or run (there is no Mac where this project was built).
 *
 * DNSServiceRegister() with no callback: the registration stays while the
 * reference is open, mDNSResponder renames the service on a conflict, and
 * the process exit withdraws it. A runner that listens on loopback is
 * registered for this machine only (kDNSServiceInterfaceIndexLocalOnly).
 */
#include <arpa/inet.h>
#include <dns_sd.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "advertise.h"
#include "metal_runner.h"

const int adv_available = 1;
const char *const adv_missing = NULL;

static DNSServiceRef adv_ref;

int
adv_start(const char *name, const char *host, int port, const char *backend,
    int auth, char *err, size_t errlen)
{
	TXTRecordRef txt;
	uint8_t txtbuf[128];
	DNSServiceErrorType e;
	uint32_t ifindex = net_is_loopback(host) ?
	    kDNSServiceInterfaceIndexLocalOnly : kDNSServiceInterfaceIndexAny;

	TXTRecordCreate(&txt, sizeof(txtbuf), txtbuf);
	if ((e = TXTRecordSetValue(&txt, "txtvers", 1, "1")) != 0 ||
	    (e = TXTRecordSetValue(&txt, "proto", 1, "1")) != 0 ||
	    (e = TXTRecordSetValue(&txt, "backend", (uint8_t)strlen(backend),
	    backend)) != 0 ||
	    (e = TXTRecordSetValue(&txt, "auth", 1, auth ? "1" : "0")) != 0)
		goto fail;
	e = DNSServiceRegister(&adv_ref, 0, ifindex, name[0] ? name : NULL,
	    ADV_TYPE, NULL, NULL, htons((uint16_t)port),
	    TXTRecordGetLength(&txt), TXTRecordGetBytesPtr(&txt), NULL, NULL);
	TXTRecordDeallocate(&txt);
	if (e != kDNSServiceErr_NoError) {
		snprintf(err, errlen, "DNSServiceRegister failed: error %d", e);
		return -1;
	}
	fprintf(stderr, "metal_runner: advertising %s on port %d with DNS-SD\n",
	    ADV_TYPE, port);
	return 0;
fail:
	TXTRecordDeallocate(&txt);
	snprintf(err, errlen, "cannot build the TXT record: error %d", e);
	return -1;
}
