/* advertise_none.c: a build without DNS-SD; --advertise is refused. */
#include <stddef.h>
#include <stdio.h>

#include "advertise.h"

const int adv_available = 0;
const char *const adv_missing = "this runner was built without DNS-SD "
    "support (on Linux: install Avahi's client library, Debian's "
    "libavahi-client-dev, and rebuild)";

int
adv_start(const char *name, const char *host, int port, const char *backend,
    int auth, char *err, size_t errlen)
{
	(void)name; (void)host; (void)port; (void)backend; (void)auth;
	snprintf(err, errlen, "%s", adv_missing);
	return -1;
}
