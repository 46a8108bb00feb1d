"""The PyInstaller entry script: the tray app's main()."""
import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
