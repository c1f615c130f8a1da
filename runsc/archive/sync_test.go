package archive

import "golang.org/x/sys/unix"

func unixSyncfs(fd int) { unix.Syncfs(fd) }
