"""flashcute in other libraries' models: each submodule plugs it into one library (and imports that library)."""
