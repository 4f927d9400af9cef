/*
 * slurm-gpu user command: a setgid (group slurm-gpu) front for the Python CLI.
 *
 * The store's credentials (the config's store.url, or a SQLite file) are readable by
 * root and the slurm-gpu group only, so that no user can bypass slurm-gpu's privacy
 * rules by reading the store directly. Users run this program instead of the venv's
 * console script: it runs the CLI with the slurm-gpu group, the system config, and
 * the caller's real uid, which is who the privacy rules see (like sacct: the caller is
 * who they are, not what a flag says).
 *
 * A scripting language cannot be setgid, hence this small C program. What it does for
 * a caller other than root:
 * - only the read commands (sacct, report, job, status, audit) and --help/--version
 *   run; everything else (config, db, exempt, controller, node, sync, ...) is refused,
 *   since with the group's credentials it could read or change any record; the read
 *   commands show the caller's own jobs (audit: the decisions about them);
 * - the config is the one compiled in: --config and SLURM_GPU_CONFIG are not honoured
 *   (a config of the caller's choosing could name them an admin);
 * - the environment is rebuilt from a short allow-list (locale, terminal, TZ), PATH is
 *   fixed, and Python runs isolated (-I: no PYTHON* variables, no user site, no
 *   current directory on sys.path), so no code of the caller's runs with the group.
 * Root runs everything with its own environment, as with the venv's console script.
 * The CLI gives the group up (setresgid to the real gid) as soon as it has read the
 * config and opened the store (slurm_gpu/app.py), so whatever a user asks it to write
 * (`report monthly --out DIR`) is written with the user's own rights only.
 *
 * Build (scripts/install-user-command does this):
 *   cc -O2 -Wall -DSLURM_GPU_PYTHON='"/opt/slurm-gpu/venv/bin/python"' \
 *      -DSLURM_GPU_CONFIG='"/etc/slurm-gpu/slurm-gpu.toml"' -o slurm-gpu slurm-gpu.c
 *   chown root:slurm-gpu slurm-gpu && chmod 2755 slurm-gpu
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SLURM_GPU_PYTHON
#define SLURM_GPU_PYTHON "/opt/slurm-gpu/venv/bin/python"
#endif
#ifndef SLURM_GPU_CONFIG
#define SLURM_GPU_CONFIG "/etc/slurm-gpu/slurm-gpu.toml"
#endif
#define SAFE_PATH "/usr/local/bin:/usr/bin:/bin"

static const char *const user_commands[] = {
    "sacct", "report", "job", "status", "audit", "--help", "-h", "--version", NULL,
};

/* Variables copied from the caller: display only, none is a path the CLI loads. */
static const char *const kept_variables[] = {
    "LANG", "LANGUAGE", "TERM", "TZ", "COLUMNS", "LINES", "NO_COLOR", NULL,
};

static int listed(const char *word, const char *const *list) {
    for (; *list != NULL; list++)
        if (strcmp(word, *list) == 0)
            return 1;
    return 0;
}

/* Whether NAME=value should pass: an allow-listed name, or a LC_* locale category. */
static int kept(const char *entry) {
    const char *eq = strchr(entry, '=');
    if (eq == NULL || eq == entry || eq - entry > 64)
        return 0;
    char name[65];
    memcpy(name, entry, (size_t)(eq - entry));
    name[eq - entry] = '\0';
    if (strncmp(name, "LC_", 3) == 0 && strspn(name + 3, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") ==
                                            strlen(name + 3))
        return 1;
    return listed(name, kept_variables);
}

int main(int argc, char **argv) {
    extern char **environ;
    uid_t uid = getuid();
    char **args = calloc((size_t)argc + 6, sizeof(char *));
    if (args == NULL) {
        fprintf(stderr, "slurm-gpu: out of memory\n");
        return 1;
    }
    size_t a = 0;
    args[a++] = SLURM_GPU_PYTHON;
    char **env = environ;

    if (uid == 0) {
        /* Root: the console script's behaviour, with the compiled-in config as default. */
        args[a++] = "-m";
        args[a++] = "slurm_gpu.cli.main";
        if (getenv("SLURM_GPU_CONFIG") == NULL) {
            args[a++] = "--config";
            args[a++] = SLURM_GPU_CONFIG;
        }
    } else {
        if (argc >= 2 && !listed(argv[1], user_commands)) {
            fprintf(stderr,
                    "slurm-gpu %s: for administrators (run it as root); users can run "
                    "sacct, report, job, status and audit\n",
                    argv[1]);
            return 2;
        }
        size_t count = 0;
        for (char **e = environ; *e != NULL; e++)
            count++;
        env = calloc(count + 2, sizeof(char *));
        if (env == NULL) {
            fprintf(stderr, "slurm-gpu: out of memory\n");
            return 1;
        }
        size_t n = 0;
        env[n++] = "PATH=" SAFE_PATH;
        for (char **e = environ; *e != NULL; e++)
            if (kept(*e))
                env[n++] = *e;
        env[n] = NULL;
        args[a++] = "-I";
        args[a++] = "-m";
        args[a++] = "slurm_gpu.cli.main";
        args[a++] = "--config";
        args[a++] = SLURM_GPU_CONFIG;
    }
    for (int i = 1; i < argc; i++)
        args[a++] = argv[i];
    args[a] = NULL;

    execve(SLURM_GPU_PYTHON, args, env);
    fprintf(stderr, "slurm-gpu: cannot run %s: %s\n", SLURM_GPU_PYTHON, strerror(errno));
    return 127;
}
