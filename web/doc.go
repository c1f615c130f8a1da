// Package web will hold the embedded browser UI (terminal, IDE, session
// list). No UI is served yet.
package web
