/* version.h — the program's version, and where the build's commit comes
 * from. NS_GIT_COMMIT is passed by the Makefile (git rev-parse --short
 * HEAD, "-dirty" when the checkout has uncommitted changes) only to
 * main.o, the one object that prints it, so a new commit rebuilds that
 * object alone; outside a git checkout it is "unknown". */
#ifndef NS_VERSION_H
#define NS_VERSION_H

#define NS_VERSION "0.1.0"

#ifndef NS_GIT_COMMIT
#define NS_GIT_COMMIT "unknown"
#endif

#endif
