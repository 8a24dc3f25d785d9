#include <connex/connex.h>
#include <stdio.h>
int main(void)
{
    cx_config_t c = { .model = "app" };
    cx_engine_t *e;
    int rc = cx_engine_create(&c, &e);
    if (rc) {
        printf("rc %d\n", rc);
        return 1;
    }
    printf("%s %s\n", cx_engine_local_url(e), cx_engine_backends(e));
    cx_engine_destroy(e);
    return 0;
}
