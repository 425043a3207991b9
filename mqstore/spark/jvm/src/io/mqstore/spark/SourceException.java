package io.mqstore.spark;

/** A path or option given to the commitlog source is refused; the message names it. */
public final class SourceException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    public SourceException(String message) {
        super(message);
    }
}
