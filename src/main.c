/* main.c — placeholder CLI entry (replaced as subcommands land). */
#include <stdio.h>
int main(void) { puts("nightshift"); return 0; }
