package seccomp

//go:generate go run mksyscalls.go /usr/include/x86_64-linux-gnu/asm
