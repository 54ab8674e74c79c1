<prompt schema="code-generation-game">
    <game.py/>
    <database.py/>
    <user>
        Add two methods to Database: save_to_file(path), which writes the games and the player
        statistics to a JSON file, and a classmethod load_from_file(path) that restores them. Make the
        write atomic by writing to a temporary file first and renaming it.
    </user>
</prompt>
