// Package layering holds no code: its test pins the import graph of the
// module (docs/development.md, "Layering").
package layering
