"""The TensorRT engine on the host: its build (`build`), the 10.3 readiness check (`readiness`), the engine
inspector's plane copies (`inspect`), the build log (`log`) and the engine-against-reference check the device check
runs as a child (`check`)."""
