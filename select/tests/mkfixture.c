/* cx-mkfixture LAYOUT DIR: build a synthetic sysfs tree (for connex-probe --sysfs). */
#include "fixture.h"
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cx-mkfixture LAYOUT DIR\n");
        return 2;
    }
    return cx_fixture_build(argv[1], argv[2]) ? 1 : 0;
}
