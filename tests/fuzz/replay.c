/* Runs a fuzz target's LLVMFuzzerTestOneInput once on every file of the given directories or
 * files: the corpus as a regression test, with any compiler and sanitizer, without libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    if (!buf) return -1;
    /* An exact-size copy, so ASan sees a read one past the input. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i])) return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], de->d_name);
            if (run_file(p)) {
                closedir(d);
                return 1;
            }
            count++;
        }
        closedir(d);
    }
    printf("replayed %d inputs\n", count);
    return count ? 0 : 1; /* an empty corpus is a broken test, not a pass */
}
