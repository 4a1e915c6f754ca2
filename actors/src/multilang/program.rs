//! Finding the child's program as the operating system will start it, so a missing or
//! unrunnable `executableName` is refused at start with why.

/// `program` as `execvp` finds it: a path when it has a `/` (relative to `cwd`), else
/// the first file of that name in `path`'s directories that may be executed. `Err`
/// says why none can be run.
pub(super) fn find_program(
    program: &str,
    path: &std::ffi::OsStr,
    cwd: &std::path::Path,
) -> Result<std::path::PathBuf, String> {
    use std::path::Path;
    if program.contains('/') {
        let at = cwd.join(program);
        return runnable(&at).map(|()| at).map_err(|why| {
            if Path::new(program).is_absolute() {
                why
            } else {
                format!(
                    "{why} (relative to the working directory {})",
                    cwd.display()
                )
            }
        });
    }
    let mut refused = None;
    for dir in std::env::split_paths(path) {
        // An empty entry is the working directory, as execvp reads it.
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            dir
        };
        let at = dir.join(program);
        match runnable(&at) {
            Ok(()) => return Ok(at),
            Err(why) if at.exists() => refused = refused.or(Some(why)),
            Err(_) => {}
        }
    }
    Err(refused.unwrap_or_else(|| {
        format!(
            "not found on PATH ({}); name it by its path, or install it",
            path.to_string_lossy()
        )
    }))
}

/// Whether `at` is a file the operating system will execute, or why not.
fn runnable(at: &std::path::Path) -> Result<(), String> {
    let meta = std::fs::metadata(at).map_err(|e| format!("{}: {e}", at.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", at.display()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode();
        if mode & 0o111 == 0 {
            return Err(format!(
                "{} is not executable (mode {:o}): chmod +x it, or name its interpreter \
                 first (executableName = python3 {})",
                at.display(),
                mode & 0o777,
                at.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt as _;

    use super::find_program;

    /// A program is found as execvp finds it, on PATH or by its path relative to the
    /// working directory; a missing one, a directory and a file without an executable
    /// bit are refused with why.
    #[test]
    fn the_program_is_found_as_the_operating_system_finds_it_or_refused_with_why() {
        let dir = std::env::temp_dir().join(format!("flotilla-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let tool = dir.join("bin/tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = dir.join("plain.py");
        std::fs::write(&plain, "print()\n").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path =
            std::env::join_paths(["/nonexistent", dir.join("bin").to_str().unwrap()]).unwrap();

        assert_eq!(find_program("tool", &path, &dir).unwrap(), tool);
        assert_eq!(
            find_program("./bin/tool", &path, &dir).unwrap(),
            dir.join("./bin/tool")
        );
        assert_eq!(
            find_program(tool.to_str().unwrap(), &path, std::path::Path::new("/")).unwrap(),
            tool
        );
        let missing = find_program("no-such-tool", &path, &dir).unwrap_err();
        assert!(
            missing.starts_with("not found on PATH (/nonexistent:"),
            "{missing}"
        );
        let relative = find_program("./tool", &path, &dir).unwrap_err();
        assert!(
            relative.contains("relative to the working directory"),
            "{relative}"
        );
        let plain = find_program("./plain.py", &path, &dir).unwrap_err();
        assert!(plain.contains("is not executable (mode 644)"), "{plain}");
        let folder = find_program("./bin", &path, &dir).unwrap_err();
        assert!(folder.contains("/bin is not a file"), "{folder}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
