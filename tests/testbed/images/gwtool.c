/* gwtool: the test bed's workload image. A container of it says what it was given and how it was stopped, so
 * the e2e tests can read the facts from the container itself (its log, or a file on a hostPath volume):
 *
 *   gwtool [--env PREFIX]... [--ls DIR]... [--cat FILE]... [--record FILE] [--sleep SECONDS]
 *          [--term-delay SECONDS] [--exit CODE]
 *
 *   --env PREFIX      print every environment variable whose name starts with PREFIX ("" = all), sorted
 *   --ls DIR          print the names in DIR (the files a device plugin mounted, say)
 *   --cat FILE        print FILE's content
 *   --record FILE     also append every event line to FILE (a hostPath file outlives the pod)
 *   --sleep SECONDS   then wait this long (0 = forever) unless a signal comes
 *   --term-delay S    on SIGTERM: print "event=sigterm", keep running S seconds, then exit 0 (grace tests)
 *   --exit CODE       exit code after the sleep (default 0)
 *
 * Every line is "gwtool: t=<unix seconds.millis> <text>". Built static (gcc -static), one file on an empty root. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile sig_atomic_t got_term = 0;
static FILE *record = NULL;

static void on_term(int sig) {
    (void)sig;
    got_term = 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...) {
    char text[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    double t = now();
    printf("gwtool: t=%.3f %s\n", t, text);
    fflush(stdout);
    if (record != NULL) {
        fprintf(record, "gwtool: t=%.3f %s\n", t, text);
        fflush(record);
    }
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void print_env(const char *prefix) {
    size_t n = 0;
    for (char **e = environ; *e != NULL; e++) n++;
    char **sorted = calloc(n + 1, sizeof *sorted);
    if (sorted == NULL) return;
    for (size_t i = 0; i < n; i++) sorted[i] = environ[i];
    qsort(sorted, n, sizeof *sorted, cmp);
    for (size_t i = 0; i < n; i++)
        if (strncmp(sorted[i], prefix, strlen(prefix)) == 0) say("env %s", sorted[i]);
    free(sorted);
}

static void list_dir(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL) {
        say("ls %s error=%s", path, strerror(errno));
        return;
    }
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL)
        if (ent->d_name[0] != '.') say("ls %s/%s", path, ent->d_name);
    closedir(d);
}

static void cat_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        say("cat %s error=%s", path, strerror(errno));
        return;
    }
    char line[2048];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        say("cat %s: %s", path, line);
    }
    fclose(f);
}

/* Sleep up to `seconds` (forever if <= 0) in 50 ms steps; return early when `stop_on_term` and SIGTERM came. */
static void wait_for(double seconds, int stop_on_term) {
    double end = now() + seconds;
    struct timespec step = {0, 50 * 1000 * 1000};
    while (seconds <= 0 || now() < end) {
        if (stop_on_term && got_term) return;
        nanosleep(&step, NULL);
    }
}

int main(int argc, char **argv) {
    double sleep_s = -1, term_delay = 0;
    int exit_code = 0;
    struct sigaction term = {.sa_handler = on_term};
    sigaction(SIGTERM, &term, NULL);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--record") == 0 && i + 1 < argc) record = fopen(argv[i + 1], "a");
    say("event=start pid=%d", (int)getpid());
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (val == NULL) {
            say("error=missing value for %s", flag);
            return 2;
        }
        i++;
        if (strcmp(flag, "--env") == 0) print_env(val);
        else if (strcmp(flag, "--ls") == 0) list_dir(val);
        else if (strcmp(flag, "--cat") == 0) cat_file(val);
        else if (strcmp(flag, "--record") == 0) continue;
        else if (strcmp(flag, "--sleep") == 0) sleep_s = atof(val);
        else if (strcmp(flag, "--term-delay") == 0) term_delay = atof(val);
        else if (strcmp(flag, "--exit") == 0) exit_code = atoi(val);
        else {
            say("error=unknown flag %s", flag);
            return 2;
        }
    }
    if (sleep_s >= 0) {
        say("event=sleeping seconds=%.3f", sleep_s);
        wait_for(sleep_s, 1);
    }
    if (got_term) {
        say("event=sigterm term_delay=%.3f", term_delay);
        wait_for(term_delay, 0);
        say("event=exit reason=sigterm code=0");
        return 0;
    }
    say("event=exit reason=done code=%d", exit_code);
    return exit_code;
}
