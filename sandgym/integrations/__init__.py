"""The doors into the field's tools (DESIGN.md: one module or package each; every vendor
package is imported lazily, where it is used, and installed as an optional extra of sandgym)."""
